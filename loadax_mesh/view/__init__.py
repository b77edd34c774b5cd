"""The plan for people: the text report, the terminal grid and the SVG picture."""
