"""How the launcher tells a run's loss from its collateral: the order in which children end.

When one process of a `jax.distributed` job dies, the runtime ends its peers within
milliseconds (gloo's connections close, the coordination service reports the lost task), and
under load a launcher that samples its children sees them all dead at once. So the launcher
learns each end as the kernel queues it (`Waiters`) with its exit status and time (`Exit`):
the first failure is the loss, with any process that reported its own hardware lost, and the
peers that failed after it are collateral: a restart keeps them. Never imports jax.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Exit:
    """One child's end: its process index, its return code as `subprocess` gives it (negative:
    killed by that signal) and when (`time.monotonic()`) the launcher learned of it."""

    index: int
    returncode: int
    at: float

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    def what(self) -> str:
        code = self.returncode
        return f"exit code {code}" if code >= 0 else f"signal {-code}"


def exit_code(returncode: int) -> int:
    """The launcher's exit code for a child's return code (128 + N for signal N)."""
    return returncode if 0 < returncode < 256 else 128 + abs(returncode)


@dataclass(frozen=True)
class Failure:
    """A failed run: the first failure, the failures after it and before the launcher began
    stopping the rest (`followers`, in order), the processes it stopped, and those that reported
    their own hardware lost."""

    first: Exit
    followers: tuple[Exit, ...]
    stopped: tuple[int, ...]
    reported: tuple[int, ...] = ()

    @classmethod
    def of(
        cls, exits: Iterable[Exit], *, halt: float, stopped: Iterable[int], reported: Iterable[int]
    ) -> Failure:
        """The failure of a run whose children ended as `exits`, in the order they ended;
        `halt` is when the launcher began stopping those still running, `stopped` those it
        stopped."""
        failures = [e for e in exits if e.failed]
        assert failures, "a run with no failed process did not fail"
        first = failures[0]
        followers = tuple(e for e in failures[1:] if e.at <= halt)
        on_their_own = {e.index for e in followers}
        return cls(
            first,
            followers,
            tuple(sorted(set(stopped) - on_their_own)),
            tuple(sorted(set(reported))),
        )

    @property
    def lost(self) -> tuple[int, ...]:
        """The processes the job loses: the first failure and those that reported their
        hardware lost. The rest, followers included, restart."""
        return tuple(sorted({self.first.index, *self.reported}))

    @property
    def code(self) -> int:
        """The launcher's exit code: the first failure's own."""
        return exit_code(self.first.returncode)

    def describe(self) -> str:
        first = f"process {self.first.index} failed"
        if self.followers:
            after = ", ".join(f"process {e.index} ({e.what()})" for e in self.followers)
            first += f" first ({self.first.what()}); followed by {after}"
        else:
            first += f" ({self.first.what()})"
        parts = [first, f"stopped processes {list(self.stopped)}"]
        if self.reported:
            names = ", ".join(f"process {i}" for i in self.reported)
            parts.append(f"hardware reported lost by {names}")
        return "; ".join(parts)


class Waiters:
    """Learns the order in which one run's children end, each `Exit` put on `exits` as it
    comes. On Linux one thread waits on an epoll of the children's pidfds: the kernel queues a
    pidfd on the epoll's ready list the moment its process ends, so the order is the kernel's
    even when the launcher runs late under load. Elsewhere a thread waits on each child."""

    def __init__(self) -> None:
        self.exits: queue.SimpleQueue[Exit] = queue.SimpleQueue()
        self._epoll = select.epoll() if hasattr(select, "epoll") else None
        self._fds: dict[int, tuple[int, subprocess.Popen[bytes]]] = {}

    def add(self, index: int, proc: subprocess.Popen[bytes]) -> None:
        """Watch `proc`, as soon as it is started (before it can end unseen)."""
        fd = _pidfd(proc.pid) if self._epoll is not None else None
        if fd is None or self._epoll is None:
            args = (index, proc, self.exits)
            threading.Thread(target=_wait_one, args=args, daemon=True).start()
            return
        self._fds[fd] = (index, proc)
        self._epoll.register(fd, select.EPOLLIN)

    def start(self) -> None:
        """Start waiting on the children added to the epoll."""
        if self._epoll is not None:
            threading.Thread(target=self._wait_epoll, daemon=True).start()

    def _wait_epoll(self) -> None:
        assert self._epoll is not None
        try:
            while self._fds:
                ready = self._epoll.poll()  # in the order the children ended
                at = time.monotonic()
                for fd, _ in ready:
                    index, proc = self._fds.pop(fd)
                    self._epoll.unregister(fd)
                    os.close(fd)
                    self.exits.put(Exit(index, proc.wait(), at))
        finally:
            for fd in self._fds:
                os.close(fd)
            self._epoll.close()


def _pidfd(pid: int) -> int | None:
    """A pidfd of `pid` (Linux 5.3+), or None where there are none."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    with contextlib.suppress(OSError):
        return int(opener(pid))
    return None


def _wait_one(index: int, proc: subprocess.Popen[bytes], exits: queue.SimpleQueue[Exit]) -> None:
    returncode = proc.wait()
    exits.put(Exit(index, returncode, time.monotonic()))
