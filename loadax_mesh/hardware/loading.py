"""Reading a user's catalogue for the run: `load_catalogue` (Python) and the command line's
`--catalogue FILE` (`using_catalogue`); which file and how it merges: user.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import MeshConfigError
from .catalogue import Catalogue, catalogue, clear_catalogue
from .user import loaded_path, set_user_path


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
    previous = set_user_path(None if path is None else os.fspath(path))
    clear_catalogue()
    try:
        return catalogue()
    except MeshConfigError:
        set_user_path(previous)  # a refused file leaves the run's catalogue as it was
        clear_catalogue()
        raise


@contextmanager
def using_catalogue(path: str | None) -> Iterator[None]:
    """Read `path` as the user catalogue inside the block (the CLI's `--catalogue`), and the
    catalogue of before after it."""
    previous = loaded_path()
    load_catalogue(path)
    try:
        yield
    finally:
        load_catalogue(previous)
