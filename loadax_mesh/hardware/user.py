"""A user's catalogue: a TOML file in the schema of configs/hardware.toml that adds or overrides
hardware types (and may add [sources]) for one run.

Which file: the one `load_catalogue(path)` (or the CLI's `--catalogue FILE`) set, else the
environment variable LOADAX_MESH_CATALOGUE, else none. `catalogue()` (catalogue.py) reads the
shipped file merged with it: an entry the file names anew is added; an entry the shipped file
holds takes the file's facts over its own, fact by fact. Pure Python.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..errors import MeshConfigError

if TYPE_CHECKING:
    from .catalogue import Catalogue

ENV = "LOADAX_MESH_CATALOGUE"
SHIPPED = "shipped"
_TABLES = ("schema", "sources", "tpu", "gpu")  # what a user's file may hold
_loaded: str | None = None  # the file load_catalogue set; None: the environment decides


def user_path() -> str | None:
    """The user catalogue this run reads: load_catalogue's file, else $LOADAX_MESH_CATALOGUE."""
    return _loaded if _loaded is not None else (os.environ.get(ENV) or None)


def load_catalogue(path: str | os.PathLike[str] | None) -> Catalogue:
    """Read the catalogue `path` adds to (or overrides in) the shipped one, for this process.

    Every later plan, estimate, detection and hardware listing reads the merged catalogue.
    `load_catalogue(None)` drops the file again (the shipped catalogue, merged with
    $LOADAX_MESH_CATALOGUE where that is set).

    Args:
        path: a TOML file in the schema of configs/hardware.toml, or None.

    Returns:
        The merged catalogue.

    Raises:
        MeshConfigError: the file is missing, no TOML, or breaks the schema (the message names
            the file, the entry, the field and what is accepted).
    """
    global _loaded
    from .catalogue import catalogue, clear_catalogue

    previous, _loaded = _loaded, None if path is None else os.fspath(path)
    clear_catalogue()
    try:
        return catalogue()
    except MeshConfigError:
        _loaded = previous  # a refused file leaves the run's catalogue as it was
        clear_catalogue()
        raise


@contextmanager
def using_catalogue(path: str | None) -> Iterator[None]:
    """Read `path` as the user catalogue inside the block (the CLI's `--catalogue`), and the
    catalogue of before after it."""
    previous = _loaded
    load_catalogue(path)
    try:
        yield
    finally:
        load_catalogue(previous)


def read_toml(path: str) -> dict[str, Any]:
    """A TOML file's tables; MeshConfigError naming the file when it is missing or no TOML."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as err:
        raise MeshConfigError(
            f"catalogue file {path!r}: {err.strerror or err}; accepted: a readable TOML file "
            f"(--catalogue, load_catalogue or ${ENV})"
        ) from None
    except tomllib.TOMLDecodeError as err:
        raise MeshConfigError(f"catalogue file {path!r} is no TOML: {err}") from None


def merge(
    shipped: dict[str, Any], user: dict[str, Any], path: str
) -> tuple[dict[str, Any], dict[tuple[str, str], str]]:
    """The shipped tables with the user's merged in, and (platform, key) -> where each entry
    comes from: "shipped", the file's path (added), or "shipped + path" (overridden)."""
    for key in user:
        if key not in _TABLES:
            raise MeshConfigError(
                f"{path}: unknown table {key!r}; accepted in a user catalogue: {', '.join(_TABLES)}"
            )
    if user.get("schema") != shipped["schema"]:
        raise MeshConfigError(
            f"{path}: schema={user.get('schema')!r}; accepted: schema = {shipped['schema']}"
        )
    sources = dict(shipped["sources"])
    added = user.get("sources", {})
    if not isinstance(added, dict):
        raise MeshConfigError(f"{path}: sources={added!r}; accepted: a table of key = text")
    for key, text in added.items():
        if not isinstance(text, str) or not text.strip():
            raise MeshConfigError(
                f"{path}: sources.{key}={text!r}; accepted: a text naming the source"
            )
        if key in sources and sources[key] != text:
            raise MeshConfigError(
                f"{path}: sources.{key} is a shipped source key ({sources[key]!r}); accepted: "
                "a key the shipped catalogue does not use, or its same text"
            )
    sources.update(added)
    merged = {**shipped, "sources": sources}
    origins = {(p, k): SHIPPED for p in ("tpu", "gpu") for k in shipped[p]}
    for platform in ("tpu", "gpu"):
        entries = user.get(platform, {})
        if not isinstance(entries, dict):
            raise MeshConfigError(f"{path}: {platform}={entries!r}; accepted: tables of entries")
        merged[platform] = dict(shipped[platform])
        for key, entry in entries.items():
            if not isinstance(entry, dict):
                raise MeshConfigError(
                    f"{path}: {platform}.{key}={entry!r}; accepted: a table of facts"
                )
            if key in shipped[platform]:
                merged[platform][key] = {**shipped[platform][key], **entry}
                origins[platform, key] = f"{SHIPPED} + {path}"
            else:
                merged[platform][key] = entry
                origins[platform, key] = path
    return merged, origins


def origin_file(origin: str, shipped_file: str) -> str:
    """The file whose text an entry of this origin last took: to name in its errors."""
    return shipped_file if origin == SHIPPED else origin.removeprefix(f"{SHIPPED} + ")
