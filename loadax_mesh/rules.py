"""Mesh rules: `(regex, value)` pairs chosen by a hardware selector string."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, TypeVar

from .errors import MeshConfigError

T = TypeVar("T")


def match_regex_rules(
    selector: str, rules: Iterable[tuple[str, T]], *, default: Any = None
) -> T | Any:
    """The value of the first rule whose regex matches all of `selector`, else `default`.

    Args:
        selector: a hardware string such as "tpu-v5p-512".
        rules: (regex, value) pairs, tried in order with `re.fullmatch`.
        default: the value when no rule matches.

    Returns:
        The first matching rule's value, or `default`.

    Raises:
        MeshConfigError: `selector` is not a string, or a regex is not a valid regex string.
    """
    if not isinstance(selector, str):
        raise MeshConfigError(f"selector={selector!r} is not a string such as 'tpu-v5p-512'")
    for i, (regex, value) in enumerate(rules):
        if re.fullmatch(check_regex(regex, field=f"rules[{i}][0]"), selector):
            return value
    return default


def check_regex(regex: Any, *, field: str) -> str:
    """`regex` if it is a string that compiles, else a MeshConfigError naming `field`."""
    if not isinstance(regex, str):
        raise MeshConfigError(f"{field}={regex!r} is not a regex string")
    try:
        re.compile(regex)
    except re.error as err:
        raise MeshConfigError(f"{field}={regex!r} is not a valid regex: {err}") from None
    return regex
