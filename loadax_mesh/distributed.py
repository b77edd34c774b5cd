"""`loadax_mesh.distributed`: the public path of a multi-process job's child side (docs/design.md
section 3), `initialize()` and the launcher's environment contract. The code lives in
jobs/distributed.py; this module names it where users import it."""

from typing import Any

from .jobs import distributed as _distributed
from .jobs.distributed import *  # noqa: F403


def __getattr__(name: str) -> Any:
    return getattr(_distributed, name)  # `launch` and `main`, loaded on first use
