"""The launcher's children: how they start (without forking the launcher), how their output
is relayed, and how one run of them is watched and stopped, each end taken as it comes
(exits.py: the order of ends, and who failed first). Never imports jax."""

from __future__ import annotations

import contextlib
import math
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import IO, Any

from ..errors import MeshConfigError
from .exits import Exit, Failure, Waiters
from .launch_env import child_env

STOP_GRACE = 3.0  # seconds between SIGTERM and SIGKILL (jax catches SIGTERM for preemption)
POLL = 0.05
PREFIX = "loadax-mesh launch"


# The children start through this wrapper (Linux): it asks the kernel to SIGKILL it when the
# launcher dies, however the launcher dies (PR_SET_PDEATHSIG, kept across exec), then execs the
# command. Setting that in the child itself, instead of in a `preexec_fn`, keeps the launcher
# from running Python in a forked copy of itself: with a `preexec_fn`, subprocess runs the
# interpreter's at-fork hooks and Python code between fork and exec in a copy of the whole
# (threaded, perhaps jax-using) parent, and jax's at-fork hook warns with a RuntimeWarning;
# without one, the child is made (vfork or fork) and exec'd in C, no hook runs. If the launcher
# died before the signal was set, the wrapper's parent is no longer it, and the wrapper exits.
_WRAPPER = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    os._exit(1)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as err:
    print(f"loadax-mesh launch: {sys.argv[2]!r} could not be started: {err}", file=sys.stderr)
    os._exit(127)
"""


def _wrapped(command: Sequence[str]) -> list[str]:
    """`command` run through the parent-death wrapper on Linux, as it is elsewhere."""
    if sys.platform != "linux":
        return list(command)
    return [sys.executable, "-I", "-S", "-c", _WRAPPER, str(os.getpid()), *command]


def check_command(command: Sequence[str]) -> None:
    """The command's program exists and runs (checked here: the wrapper execs it later)."""
    program = command[0]
    found = shutil.which(program) if os.sep not in program else program
    if found is None or not os.access(found, os.X_OK) or os.path.isdir(found):
        raise MeshConfigError(
            f"command={list(command)!r} could not be started: {program!r} is not an executable "
            "file or a program on PATH"
        )


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


class Stop(Exception):
    """The launcher itself was asked to stop (SIGTERM)."""


def raise_stop(signum: int, frame: Any) -> None:
    raise Stop


def stop(procs: dict[int, subprocess.Popen[bytes]]) -> list[int]:
    """Stop every child still running (SIGTERM to its process group, then SIGKILL)."""
    running = [i for i, p in procs.items() if p.poll() is None]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for i in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(procs[i].pid, sig)
        deadline = time.monotonic() + STOP_GRACE
        while time.monotonic() < deadline and any(procs[i].poll() is None for i in running):
            time.sleep(POLL)
        if all(procs[i].poll() is not None for i in running):
            break
    return running


class Job:
    """The runs of one launched job: its children, their output pumps and their waiters, one
    run at a time. `close()` ends it."""

    def __init__(
        self, command: list[str], devices: int, host: str, timeout: float, verbose: bool
    ) -> None:
        self.command, self.devices, self.host = command, devices, host
        self.timeout, self.verbose = timeout, verbose
        self.deadline = time.monotonic() + timeout
        self.lock = threading.Lock()
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.pumps: dict[int, list[threading.Thread]] = {}
        self.exits: queue.SimpleQueue[Exit] = queue.SimpleQueue()  # this run's ends, in order
        self.reports = tempfile.mkdtemp(prefix="loadax-mesh-launch-")  # hardware-lost reports
        self.lost_dir = ""  # this run's folder of them

    def say(self, message: str) -> None:
        _say(self.lock, message)

    def run(self, nprocs: int, restart: int, port: int) -> tuple[int, int]:
        """Start `nprocs` children and watch them: (exit code, how many processes are lost)."""
        self.end()
        left = max(1, math.ceil(self.deadline - time.monotonic()))
        waiters = Waiters()
        self.exits = waiters.exits  # a late end of the last run stays in that run's queue
        self.lost_dir = os.path.join(self.reports, f"run-{restart}")
        os.makedirs(self.lost_dir)
        for i in range(nprocs):
            env = child_env(
                os.environ,
                index=i,
                nprocs=nprocs,
                devices_per_process=self.devices,
                coordinator=f"{self.host}:{port}",
                init_timeout=left,
                restart=restart,
                lost_dir=self.lost_dir,
            )
            self.procs[i] = _spawn(self.command, env)
            waiters.add(i, self.procs[i])
        waiters.start()
        for i, proc in self.procs.items():
            self.pumps[i] = [
                _start_pump(proc.stdout, sys.stdout, i, self.lock, self.verbose),
                _start_pump(proc.stderr, sys.stderr, i, self.lock, self.verbose),
            ]
        return self.watch()

    def watch(self) -> tuple[int, int]:
        """Take the children's ends as they come until all succeed, one fails, or time runs
        out."""
        ended: list[Exit] = []
        while len(ended) < len(self.procs):
            wait = self.deadline - time.monotonic()
            if wait <= 0:
                stopped = stop(self.procs)
                self.say(
                    f"timed out after {self.timeout:g} s (--timeout); stopped processes {stopped}"
                )
                return 124, 0
            try:  # bounded, so that a signal to the launcher is handled promptly
                ended.append(self.exits.get(timeout=min(wait, 0.5)))
            except queue.Empty:
                continue
            if ended[-1].failed:
                return self.failed(ended)
        return 0, 0

    def failed(self, ended: list[Exit]) -> tuple[int, int]:
        """Stop the rest, gather every end, and say who failed first and who followed."""
        halt = time.monotonic()
        stopped = stop(self.procs)
        with contextlib.suppress(queue.Empty):  # stop() ended them all: their waiters report
            while len(ended) < len(self.procs):
                ended.append(self.exits.get(timeout=STOP_GRACE))
        reported = [int(name) for name in os.listdir(self.lost_dir) if name.isdigit()]
        failure = Failure.of(ended, halt=halt, stopped=stopped, reported=reported)
        for e in (failure.first, *failure.followers):  # last words first
            for thread in self.pumps[e.index]:
                thread.join(timeout=1.0)
        self.say(failure.describe())
        return failure.code, len(failure.lost)

    def end(self) -> None:
        """Stop this run's children and let their output drain (bounded)."""
        stop(self.procs)
        for thread in (t for threads in self.pumps.values() for t in threads):
            thread.join(timeout=STOP_GRACE)
        self.procs.clear()
        self.pumps.clear()

    def close(self) -> None:
        """End the last run and remove the job's report folder."""
        self.end()
        shutil.rmtree(self.reports, ignore_errors=True)


def _spawn(command: Sequence[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start one child in its own session; no `preexec_fn`, so the launcher is not forked."""
    try:
        return subprocess.Popen(
            _wrapped(command),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
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
        print(f"{PREFIX}: {message}", file=sys.stderr, flush=True)
