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
from typing import Any

from ..errors import MeshConfigError

ENV = "LOADAX_MESH_CATALOGUE"
SHIPPED = "shipped"
_TABLES = ("schema", "sources", "tpu", "gpu")  # what a user's file may hold
_loaded: str | None = None  # the file load_catalogue set; None: the environment decides


def user_path() -> str | None:
    """The user catalogue this run reads: load_catalogue's file, else $LOADAX_MESH_CATALOGUE."""
    return _loaded if _loaded is not None else (os.environ.get(ENV) or None)


def loaded_path() -> str | None:
    """The file load_catalogue set, None where it set none."""
    return _loaded


def set_user_path(path: str | None) -> str | None:
    """Make `path` the file load_catalogue set (None: the environment decides); the one before."""
    global _loaded
    previous, _loaded = _loaded, path
    return previous


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
