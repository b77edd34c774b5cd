"""The launcher's environment contract: how `loadax-mesh launch` tells each child to join.

`child_env` (the launcher side) writes the `LOADAX_MESH_*` variables and the CPU device count;
`launcher_env` (the child side, in `distributed.initialize`) reads them back. The launcher
imports this module and never `distributed`, which re-exports it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import MeshConfigError

ENV_COORDINATOR = "LOADAX_MESH_COORDINATOR"
ENV_NUM_PROCESSES = "LOADAX_MESH_NUM_PROCESSES"
ENV_PROCESS_ID = "LOADAX_MESH_PROCESS_ID"
ENV_DEVICES_PER_PROCESS = "LOADAX_MESH_DEVICES_PER_PROCESS"
ENV_INIT_TIMEOUT = "LOADAX_MESH_INIT_TIMEOUT"
ENV_RESTART = "LOADAX_RESTART"  # 0 on the first run, then 1, 2, ... (launch --max-restarts)
ENV_LOST_DIR = "LOADAX_MESH_LOST_DIR"  # where a child reports its own hardware lost

_COUNT_FLAG = re.compile(r"--xla_force_host_platform_device_count=\S*")


def child_env(
    base: Mapping[str, str],
    *,
    index: int,
    nprocs: int,
    devices_per_process: int,
    coordinator: str,
    init_timeout: int,
    restart: int = 0,
    lost_dir: str | None = None,
) -> dict[str, str]:
    """The environment of child `index`: the launcher's settings, K CPU devices, unbuffered,
    which run of the job this is (`LOADAX_RESTART`: 0 first, then 1, 2, ...) and the folder
    where it reports its own hardware lost (`report_hardware_lost`)."""
    env = dict(base)
    env.pop(ENV_LOST_DIR, None)  # a launcher's own, when launched by one, is not the child's
    if lost_dir is not None:
        env[ENV_LOST_DIR] = lost_dir
    env.update(
        {
            ENV_COORDINATOR: coordinator,
            ENV_NUM_PROCESSES: str(nprocs),
            ENV_PROCESS_ID: str(index),
            ENV_DEVICES_PER_PROCESS: str(devices_per_process),
            ENV_INIT_TIMEOUT: str(init_timeout),
            ENV_RESTART: str(restart),
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


def restart_count(env: Mapping[str, str] | None = None) -> int:
    """Which run of the job this process belongs to: `LOADAX_RESTART` (0 when unset)."""
    env_map: Mapping[str, str] = os.environ if env is None else env
    return _env_int(env_map, ENV_RESTART, low=0) if ENV_RESTART in env_map else 0


def report_hardware_lost(env: Mapping[str, str] | None = None) -> bool:
    """Tell `loadax-mesh launch` that this process's own devices are lost, before it exits:
    a restart then drops it, as it drops the first process to fail, instead of starting it
    again with the peers that failed after the first. False when not launched (no one to
    tell); on a real cluster, its scheduler learns of lost hosts its own way."""
    env_map: Mapping[str, str] = os.environ if env is None else env
    settings, folder = launcher_env(env_map), env_map.get(ENV_LOST_DIR)
    if settings is None or folder is None:
        return False
    with open(os.path.join(folder, str(settings.process_id)), "w"):
        pass
    return True


def launched() -> bool:
    """Whether this process was started by `loadax-mesh launch`."""
    return ENV_COORDINATOR in os.environ


def with_device_count(xla_flags: str, count: int) -> str:
    """`xla_flags` with `--xla_force_host_platform_device_count` set to `count` (once)."""
    rest = _COUNT_FLAG.sub("", xla_flags).split()
    return " ".join([*rest, f"--xla_force_host_platform_device_count={count}"])
