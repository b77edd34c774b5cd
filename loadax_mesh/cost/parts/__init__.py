"""parts"""
