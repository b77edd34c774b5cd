"""The launcher side of multi-process jobs: `loadax-mesh launch` and `launch()`.

`launch` starts N processes of one command, each told (through the `LOADAX_MESH_*` environment
of `launch_env.child_env`) to join a `jax.distributed` job with K CPU devices and gloo
collectives: what `torchrun --nproc_per_node` is to PyTorch, for developing multi-host code on
one machine. It only spawns, relays output and watches; it never imports jax (the children do,
in `distributed.initialize()`).

Run as `loadax-mesh launch ...` or `python -m loadax_mesh launch ...`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, Any

from ..errors import MeshConfigError
from .launch_env import child_env

DEFAULT_TIMEOUT = 600.0
_STOP_GRACE = 3.0  # seconds between SIGTERM and SIGKILL (jax catches SIGTERM for preemption)
_POLL = 0.05
_PREFIX = "loadax-mesh launch"


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


def _death_signal() -> Any:
    """A function to run in the child before exec (Linux): it makes the child get SIGKILL
    when the launcher dies, however it dies. Looked up here, in the parent, so the child
    between fork and exec only makes one C call."""
    if sys.platform != "linux":
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


# jax's gloo collectives announce every connection they make; shown only with --verbose. Gloo
# writes each message in pieces from C++ threads on the child's own descriptors, so under load
# two messages can interleave and split across lines, or land inside a line of the child's.
# Every piece is cut out wherever it is, and a line left with nothing but the numbers the
# pieces carried is dropped.
_NOISE = re.compile(
    r"\[Gloo\] Rank \d*|\d* is connected to \d*| peer ranks\. "
    r"|Expected number of connected peer ranks is : \d*"
)


def _quiet(line: str) -> str | None:
    """`line` without gloo's connection messages; None when nothing of the child's is left."""
    if not _NOISE.search(line):
        return line
    rest = _NOISE.sub("", line)
    return None if re.fullmatch(r"[\d\s]*", rest) else rest


def _pump(
    stream: IO[bytes], out: IO[str], prefix: str, lock: threading.Lock, verbose: bool
) -> None:
    for raw in iter(stream.readline, b""):
        text = raw.decode(errors="replace")
        line = text if verbose else _quiet(text)
        if line is None:
            continue
        with lock:
            out.write(prefix + (line if line.endswith("\n") else line + "\n"))
            out.flush()
    stream.close()


class _Stop(Exception):
    """The launcher itself was asked to stop (SIGTERM)."""


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop


def _stop(procs: dict[int, subprocess.Popen[bytes]]) -> list[int]:
    """Stop every child still running (SIGTERM to its process group, then SIGKILL)."""
    running = [i for i, p in procs.items() if p.poll() is None]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for i in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(procs[i].pid, sig)
        deadline = time.monotonic() + _STOP_GRACE
        while time.monotonic() < deadline and any(procs[i].poll() is None for i in running):
            time.sleep(_POLL)
        if all(procs[i].poll() is not None for i in running):
            break
    return running


def _exit_code(returncode: int) -> int:
    return returncode if 0 < returncode < 256 else 128 + abs(returncode)


def launch(
    command: Sequence[str],
    *,
    nprocs: int,
    devices_per_process: int,
    port: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    host: str = "127.0.0.1",
    verbose: bool = False,
) -> int:
    """Run `command` as `nprocs` local processes of one jax.distributed job; return the exit
    code: 0 when all succeed, else the first failing child's code (the others are stopped),
    124 on timeout. Gloo's connection messages are relayed only when `verbose`."""
    if isinstance(command, str) or not command or not all(isinstance(c, str) for c in command):
        raise MeshConfigError(
            f"command={command!r}; accepted: a non-empty list of strings, e.g. "
            "['python', 'train.py']"
        )
    _check_int(nprocs, field="nprocs", low=1)
    _check_int(devices_per_process, field="devices_per_process", low=1)
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
    lock = threading.Lock()
    procs: dict[int, subprocess.Popen[bytes]] = {}
    pumps: dict[int, list[threading.Thread]] = {}
    in_main = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _raise_stop) if in_main else None
    deadline = time.monotonic() + timeout
    try:
        on_fork = _death_signal()
        for i in range(nprocs):
            env = child_env(
                os.environ,
                index=i,
                nprocs=nprocs,
                devices_per_process=devices_per_process,
                coordinator=f"{host}:{port}",
                init_timeout=max(1, math.ceil(timeout)),
            )
            procs[i] = _spawn(command, env, on_fork)
        for i, proc in procs.items():  # threads only after every fork
            pumps[i] = [
                _start_pump(proc.stdout, sys.stdout, i, lock, verbose),
                _start_pump(proc.stderr, sys.stderr, i, lock, verbose),
            ]
        return _watch(procs, pumps, deadline, timeout, lock)
    except (KeyboardInterrupt, _Stop):
        _say(lock, f"interrupted; stopped processes {_stop(procs)}")
        return 130
    finally:
        _stop(procs)
        for thread in (t for threads in pumps.values() for t in threads):
            thread.join(timeout=_STOP_GRACE)
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


def _spawn(command: Sequence[str], env: dict[str, str], on_fork: Any) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(
            list(command),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=on_fork,
        )
    except OSError as err:
        raise MeshConfigError(f"command={list(command)!r} could not be started: {err}") from None


def _start_pump(
    stream: IO[bytes] | None, out: IO[str], index: int, lock: threading.Lock, verbose: bool
) -> threading.Thread:
    assert stream is not None
    args = (stream, out, f"[{index}] ", lock, verbose)
    thread = threading.Thread(target=_pump, args=args, daemon=True)
    thread.start()
    return thread


def _say(lock: threading.Lock, message: str) -> None:
    with lock:
        print(f"{_PREFIX}: {message}", file=sys.stderr, flush=True)


def _watch(
    procs: dict[int, subprocess.Popen[bytes]],
    pumps: dict[int, list[threading.Thread]],
    deadline: float,
    timeout: float,
    lock: threading.Lock,
) -> int:
    while True:
        codes = {i: p.poll() for i, p in procs.items()}
        failed = [i for i, code in codes.items() if code not in (None, 0)]
        if failed:
            code = codes[failed[0]]
            assert code is not None
            what = f"exit code {code}" if code > 0 else f"signal {-code}"
            stopped = _stop(procs)
            for thread in (t for i in failed for t in pumps[i]):  # its last words first
                thread.join(timeout=1.0)
            names = ", ".join(f"process {i}" for i in failed)
            _say(lock, f"{names} failed ({what}); stopped processes {stopped}")
            return _exit_code(code)
        if all(code == 0 for code in codes.values()):
            return 0
        if time.monotonic() > deadline:
            stopped = _stop(procs)
            _say(lock, f"timed out after {timeout:g} s (--timeout); stopped processes {stopped}")
            return 124
        time.sleep(_POLL)


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
        "stops the others.",
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
        )
    except MeshConfigError as err:
        print(f"{_PREFIX}: error: {err}", file=sys.stderr)
        return 2
