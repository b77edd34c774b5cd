"""Multi-process jobs, the child side: `initialize()`.

`loadax-mesh launch` (in `launcher.py`) starts N processes and tells each, through the
`LOADAX_MESH_*` variables of `launch_env` (re-exported here), how to join one `jax.distributed`
job with K CPU devices and gloo collectives. `initialize()` runs in a child (or on a real
cluster, where it calls `jax.distributed.initialize()` unchanged).

`launch` and `main` are re-exported from `launcher` (loaded on first use, so a child does not
load the launcher's machinery). Users import it as `loadax_mesh.distributed`.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, NoReturn

from ..errors import MeshConfigError
from .launch_env import (
    ENV_COORDINATOR,
    ENV_DEVICES_PER_PROCESS,
    ENV_INIT_TIMEOUT,
    ENV_LOST_DIR,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
    ENV_RESTART,
    LauncherEnv,
    child_env,
    launched,
    launcher_env,
    report_hardware_lost,
    restart_count,
    with_device_count,
)

if TYPE_CHECKING:
    from .launcher import launch, main

__all__ = [
    "ENV_COORDINATOR",
    "ENV_DEVICES_PER_PROCESS",
    "ENV_INIT_TIMEOUT",
    "ENV_LOST_DIR",
    "ENV_NUM_PROCESSES",
    "ENV_PROCESS_ID",
    "ENV_RESTART",
    "LauncherEnv",
    "child_env",
    "initialize",
    "launch",
    "launched",
    "launcher_env",
    "main",
    "report_hardware_lost",
    "restart_count",
    "with_device_count",
]


def __getattr__(name: str) -> Any:
    if name in ("launch", "main"):
        from . import launcher

        return getattr(launcher, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- joining the job ----------------------------------------------------------------------------


def initialize(**kwargs: Any) -> None:
    """Join the job: from the launcher's environment, or `jax.distributed.initialize(**kwargs)`
    unchanged (TPU pods, SLURM, Kubernetes detect their own settings).

    Under the launcher this sets K CPU devices and gloo CPU collectives, so it must run before
    jax touches its devices; `kwargs` other than the coordinator, process count and process id
    are passed on. A process that then fails ends at once instead of waiting in jax's shutdown
    barrier for processes that may never get there, so the launcher sees the failure and stops
    the others: an uncaught exception exits with code 1, `sys.exit(n)` (or `exit(n)`) with n;
    only a `raise SystemExit(n)` written out still waits. A process that exits with 0 waits in
    the barrier for the others (jax's behaviour).
    """
    import jax

    settings = launcher_env()
    if settings is None:
        jax.distributed.initialize(**kwargs)
        return
    clash = sorted({"coordinator_address", "num_processes", "process_id"} & kwargs.keys())
    if clash:
        raise MeshConfigError(
            f"initialize({', '.join(clash)}=...) under `loadax-mesh launch`, which sets them; "
            "accepted: other jax.distributed.initialize arguments"
        )
    if _backends_initialized():
        raise RuntimeError(
            "loadax_mesh.distributed.initialize() must run before jax uses its devices (it sets "
            "the CPU device count and collectives); call it first in the script"
        )
    os.environ["XLA_FLAGS"] = with_device_count(
        os.environ.get("XLA_FLAGS", ""), settings.devices_per_process
    )
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    for stream in (sys.stdout, sys.stderr):
        # Whole lines in one write each: gloo's C++ prints on the same file descriptors, and an
        # unbuffered print writes its text and its newline separately.
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]
    if settings.init_timeout is not None:
        kwargs.setdefault("initialization_timeout", settings.init_timeout)
    jax.distributed.initialize(
        coordinator_address=settings.coordinator,
        num_processes=settings.num_processes,
        process_id=settings.process_id,
        **kwargs,
    )
    sys.excepthook = _exit_at_once(sys.excepthook)
    sys.exit = _exit
    builtins.exit = builtins.quit = _exit  # type: ignore[assignment]
    atexit.register(_end_a_failed_exit)  # after jax's shutdown hook, so it runs before it


def _exit_at_once(previous: Any) -> Any:
    """An excepthook that reports the exception, then ends the process with code 1 at once.

    Without it a failing child would wait in jax's shutdown barrier (an atexit handler) for
    processes that may be blocked waiting for it, and the launcher would not see it fail.
    """

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        previous(kind, value, tb)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(1)

    return hook


_CODE = SystemExit.__dict__["code"]  # SystemExit's own `code` slot
_exit_status: list[Any] = []  # the status this process exits with, once the interpreter reads it


class _Exit(SystemExit):
    """The SystemExit of `sys.exit` in a launched child. The interpreter reads `code` once,
    with no Python caller, when the exception ends the process: that read is recorded, so a
    status caught and handled by the script is never mistaken for the process's own."""

    @property
    def code(self) -> Any:
        value = _CODE.__get__(self)
        if sys._getframe().f_back is None:
            _exit_status.append(value)
        return value

    @code.setter
    def code(self, value: Any) -> None:
        _CODE.__set__(self, value)


def _exit(status: Any = None) -> NoReturn:
    """`sys.exit` for a launched child (threads other than the main one get the plain one)."""
    if threading.current_thread() is threading.main_thread():
        raise _Exit(status)
    raise SystemExit(status)


def _end_a_failed_exit() -> None:
    """At exit, before jax's shutdown barrier: a non-zero `sys.exit` status ends the process
    now, with that status (a non-int status, printed already, is 1, as Python makes it)."""
    if not _exit_status:
        return
    status = _exit_status[-1]
    code = 0 if status is None else status & 0xFF if isinstance(status, int) else 1
    if code:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _backends_initialized() -> bool:
    try:
        from jax._src import xla_bridge
    except ImportError:  # private module moved: let jax.distributed report the problem
        return False
    check = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(check()) if check is not None else False
