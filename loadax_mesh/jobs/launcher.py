"""The launcher side of multi-process jobs: `loadax-mesh launch` and `launch()`.

`launch` starts N processes of one command, each told (through the `LOADAX_MESH_*` environment
of `launch_env.child_env`) to join a `jax.distributed` job with K CPU devices and gloo
collectives: what `torchrun --nproc_per_node` is to PyTorch, for developing multi-host code on
one machine. It only spawns, relays output and watches; it never imports jax (the children do,
in `distributed.initialize()`). The children's machinery (starting without a fork, relaying
output, watching one run) is in children.py; this module is the job: restarts and the flags.

Run as `loadax-mesh launch ...` or `python -m loadax_mesh launch ...`.
"""

from __future__ import annotations

import argparse
import math
import re
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from typing import Any

from ..errors import MeshConfigError
from .children import PREFIX as _PREFIX
from .children import Job, Stop, check_command, raise_stop, stop

DEFAULT_TIMEOUT = 600.0


def _check_int(value: Any, *, field: str, low: int, high: int | None = None) -> int:
    accepted = f"an int >= {low}" if high is None else f"an int from {low} to {high}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise MeshConfigError(f"{field}={value!r}; accepted: {accepted}")
    if value < low or (high is not None and value > high):
        raise MeshConfigError(f"{field}={value}; accepted: {accepted}")
    return value


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free on `host` now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on `host:port` (as the jax coordinator will)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def launch(
    command: Sequence[str],
    *,
    nprocs: int,
    devices_per_process: int,
    port: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    host: str = "127.0.0.1",
    verbose: bool = False,
    max_restarts: int = 0,
    min_nprocs: int = 1,
) -> int:
    """Run `command` as `nprocs` local processes of one jax.distributed job; return the exit
    code: 0 when all succeed, else the first failing child's code (the others are stopped),
    124 on timeout. Gloo's connection messages are relayed only when `verbose`.

    Elastic: when a process fails (a non-zero exit or a signal), the others are stopped and,
    while fewer than `max_restarts` restarts were made and at least `min_nprocs` processes are
    left, the job starts again on those, with `LOADAX_RESTART` (0 on the first run) counting
    the runs, on a fresh coordinator port. The job loses the process that failed first and any
    that reported its hardware lost (`distributed.report_hardware_lost`); peers that failed
    after the first (jax's runtime ends them when one dies) restart. `timeout` bounds all runs
    together."""
    if isinstance(command, str) or not command or not all(isinstance(c, str) for c in command):
        raise MeshConfigError(
            f"command={command!r}; accepted: a non-empty list of strings, e.g. "
            "['python', 'train.py']"
        )
    _check_int(nprocs, field="nprocs", low=1)
    _check_int(devices_per_process, field="devices_per_process", low=1)
    _check_int(max_restarts, field="max_restarts", low=0)
    _check_int(min_nprocs, field="min_nprocs", low=1, high=nprocs)
    number = isinstance(timeout, int | float) and not isinstance(timeout, bool)
    if not (number and timeout > 0 and math.isfinite(timeout)):
        raise MeshConfigError(f"timeout={timeout!r}; accepted: a finite number of seconds > 0")
    if port is None:
        port = free_port(host)
    else:
        _check_int(port, field="port", low=1, high=65535)
        if not port_is_free(port, host):
            raise MeshConfigError(
                f"port={port} is in use on {host}; accepted: a free port, or no --port to let "
                "the launcher pick one"
            )
    check_command(command)
    job = Job(list(command), devices_per_process, host, timeout, verbose)
    in_main = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, raise_stop) if in_main else None
    try:
        restart = 0
        while True:
            code, lost = job.run(nprocs, restart, port)
            if not lost:
                return code
            left = nprocs - lost
            if restart >= max_restarts:
                if max_restarts:
                    job.say(f"not restarting: all {max_restarts} restarts made (--max-restarts)")
                return code
            if left < min_nprocs:
                job.say(
                    f"not restarting: {left} process{'es' * (left != 1)} left, fewer than "
                    f"--min-nprocs {min_nprocs}"
                )
                return code
            restart, nprocs, port = restart + 1, left, free_port(host)
            job.say(
                f"restart {restart} of {max_restarts}: the job again on {nprocs} "
                f"process{'es' * (nprocs != 1)} (LOADAX_RESTART={restart})"
            )
    except (KeyboardInterrupt, Stop):
        job.say(f"interrupted; stopped processes {stop(job.procs)}")
        return 130
    finally:
        job.close()
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


# -- command line -----------------------------------------------------------------------------


def _int_arg(low: int, high: int | None = None) -> Any:
    accepted = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"

    def parse(text: str) -> int:
        value = int(text) if re.fullmatch(r"\d+", text) else -1
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text!r}; accepted: {accepted}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r}; accepted: a number of seconds > 0")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, as every loadax-mesh error (no usage)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=_PREFIX,
        description="Run CMD as N local processes of one jax.distributed job, each with K CPU "
        "devices (gloo collectives). Output lines carry the process index; a failing process "
        "stops the others, and the launcher names the one that failed first and exits with its "
        "code.",
    )
    add = parser.add_argument
    add("--nprocs", type=_int_arg(1), required=True, metavar="N", help="number of processes")
    add(
        "--devices-per-process",
        type=_int_arg(1),
        required=True,
        metavar="K",
        help="CPU devices in each process",
    )
    add(
        "--port",
        type=_int_arg(1, 65535),
        metavar="P",
        help="coordinator port on 127.0.0.1 (default: a free one)",
    )
    add(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="S",
        help=f"stop the job after S seconds (default {DEFAULT_TIMEOUT:g})",
    )
    add(
        "--max-restarts",
        type=_int_arg(0),
        default=0,
        metavar="R",
        help="when a process fails, start the job again without it, up to R times (peers that "
        "fail after it restart; LOADAX_RESTART=0, 1, ... tells each run which it is; default 0)",
    )
    add(
        "--min-nprocs",
        type=_int_arg(1),
        default=1,
        metavar="M",
        help="restart only while at least M processes are left (default 1)",
    )
    add(
        "--verbose",
        action="store_true",
        help="also relay gloo's connection messages ('[Gloo] Rank i is connected ...')",
    )
    add("command", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="what each process runs")
    return parser


def main(argv: list[str] | None = None) -> int:
    """`loadax-mesh launch` with `argv` (the arguments after `launch`); returns the exit code."""
    parser = _parser()
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            parser.error("no command given; accepted: -- CMD ... (e.g. -- python train.py)")
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        return launch(
            command,
            nprocs=args.nprocs,
            devices_per_process=args.devices_per_process,
            port=args.port,
            timeout=args.timeout,
            verbose=args.verbose,
            max_restarts=args.max_restarts,
            min_nprocs=args.min_nprocs,
        )
    except MeshConfigError as err:
        print(f"{_PREFIX}: error: {err}", file=sys.stderr)
        return 2
