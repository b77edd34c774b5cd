"""Counts in words, for the messages of hardware detection and the plan's text report (which
both import it from here, the lower of their layers)."""

from __future__ import annotations


def count_text(n: int, noun: str, plural: str = "s") -> str:
    """`3 hosts`, `1 host`, `2 processes` (plural="es")."""
    return f"{n} {noun}{plural * (n != 1)}"
