"""Multi-process jobs, the child side: `initialize()` and the launcher's environment contract.

`loadax-mesh launch` (in `launcher.py`) starts N processes and tells each, through the
`LOADAX_MESH_*` variables that `child_env` writes and `launcher_env` reads, how to join one
`jax.distributed` job with K CPU devices and gloo collectives. `initialize()` runs in a child
(or on a real cluster, where it calls `jax.distributed.initialize()` unchanged).

`launch` and `main` are re-exported from `launcher` (loaded on first use, so a child does not
load the launcher's machinery); `python -m loadax_mesh.distributed ...` runs the launcher.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import os
import re
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from .errors import MeshConfigError

if TYPE_CHECKING:
    from .launcher import launch, main

__all__ = [
    "ENV_COORDINATOR",
    "ENV_DEVICES_PER_PROCESS",
    "ENV_INIT_TIMEOUT",
    "ENV_NUM_PROCESSES",
    "ENV_PROCESS_ID",
    "LauncherEnv",
    "child_env",
    "initialize",
    "launch",
    "launched",
    "launcher_env",
    "main",
    "with_device_count",
]

ENV_COORDINATOR = "LOADAX_MESH_COORDINATOR"
ENV_NUM_PROCESSES = "LOADAX_MESH_NUM_PROCESSES"
ENV_PROCESS_ID = "LOADAX_MESH_PROCESS_ID"
ENV_DEVICES_PER_PROCESS = "LOADAX_MESH_DEVICES_PER_PROCESS"
ENV_INIT_TIMEOUT = "LOADAX_MESH_INIT_TIMEOUT"

_COUNT_FLAG = re.compile(r"--xla_force_host_platform_device_count=\S*")


def __getattr__(name: str) -> Any:
    if name in ("launch", "main"):
        from . import launcher

        return getattr(launcher, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- the environment contract ---------------------------------------------------------------


def child_env(
    base: Mapping[str, str],
    *,
    index: int,
    nprocs: int,
    devices_per_process: int,
    coordinator: str,
    init_timeout: int,
) -> dict[str, str]:
    """The environment of child `index`: the launcher's settings, K CPU devices, unbuffered."""
    env = dict(base)
    env.update(
        {
            ENV_COORDINATOR: coordinator,
            ENV_NUM_PROCESSES: str(nprocs),
            ENV_PROCESS_ID: str(index),
            ENV_DEVICES_PER_PROCESS: str(devices_per_process),
            ENV_INIT_TIMEOUT: str(init_timeout),
            "XLA_FLAGS": with_device_count(env.get("XLA_FLAGS", ""), devices_per_process),
            "JAX_PLATFORMS": "cpu",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


@dataclass(frozen=True)
class LauncherEnv:
    """What the launcher tells a child, read from its environment."""

    coordinator: str
    num_processes: int
    process_id: int
    devices_per_process: int
    init_timeout: int | None


def _env_int(env: Mapping[str, str], name: str, *, low: int) -> int:
    raw = env.get(name)
    if raw is None or not re.fullmatch(r"\d+", raw.strip()) or int(raw) < low:
        raise MeshConfigError(
            f"environment {name}={raw!r}; accepted: an integer >= {low} (set by "
            f"`loadax-mesh launch`, next to {ENV_COORDINATOR})"
        )
    return int(raw)


def launcher_env(env: Mapping[str, str] | None = None) -> LauncherEnv | None:
    """The launcher's settings from `env` (default `os.environ`); None when not launched."""
    env_map: Mapping[str, str] = os.environ if env is None else env
    coordinator = env_map.get(ENV_COORDINATOR)
    if coordinator is None:
        return None
    if not re.fullmatch(r"\S+:\d+", coordinator):
        raise MeshConfigError(f"environment {ENV_COORDINATOR}={coordinator!r}; accepted: host:port")
    num = _env_int(env_map, ENV_NUM_PROCESSES, low=1)
    pid = _env_int(env_map, ENV_PROCESS_ID, low=0)
    if pid >= num:
        raise MeshConfigError(
            f"environment {ENV_PROCESS_ID}={pid}; accepted: 0 to {num - 1} "
            f"({ENV_NUM_PROCESSES}={num})"
        )
    devices = _env_int(env_map, ENV_DEVICES_PER_PROCESS, low=1)
    timeout = _env_int(env_map, ENV_INIT_TIMEOUT, low=1) if ENV_INIT_TIMEOUT in env_map else None
    return LauncherEnv(coordinator, num, pid, devices, timeout)


def launched() -> bool:
    """Whether this process was started by `loadax-mesh launch`."""
    return ENV_COORDINATOR in os.environ


def with_device_count(xla_flags: str, count: int) -> str:
    """`xla_flags` with `--xla_force_host_platform_device_count` set to `count` (once)."""
    rest = _COUNT_FLAG.sub("", xla_flags).split()
    return " ".join([*rest, f"--xla_force_host_platform_device_count={count}"])


# -- joining the job ----------------------------------------------------------------------------


def initialize(**kwargs: Any) -> None:
    """Join the job: from the launcher's environment, or `jax.distributed.initialize(**kwargs)`
    unchanged (TPU pods, SLURM, Kubernetes detect their own settings).

    Under the launcher this sets K CPU devices and gloo CPU collectives, so it must run before
    jax touches its devices; `kwargs` other than the coordinator, process count and process id
    are passed on. A process that then fails ends at once instead of waiting in jax's shutdown
    barrier for processes that may never get there, so the launcher sees the failure and stops
    the others: an uncaught exception exits with code 1, `sys.exit(n)` (or `exit(n)`) with n.
    A process that exits with 0 still waits in the barrier for the others (jax's behaviour).
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


if __name__ == "__main__":
    from .launcher import main as _main

    sys.exit(_main())
