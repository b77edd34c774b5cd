"""Who failed first, and who followed: the launcher learns the order in which children end.

When one process of a jax job dies, its peers die within milliseconds (the runtime ends them),
and a launcher running late sees them all dead at once. The children here never import jax:
process 3 holds a lock the others wait for (as jax's peers wait on its connections) and then
fails; they fail when it is gone.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadax_mesh import distributed
from loadax_mesh.jobs.exits import Exit, Failure

WAIT = 60  # seconds any launcher run in this file may take before the test gives up

pytestmark = pytest.mark.multiprocess


def test_the_first_failure_is_the_loss_and_its_followers_restart() -> None:
    ends = [Exit(2, 0, 1.0), Exit(3, 7, 2.0), Exit(0, 1, 2.0), Exit(1, -9, 5.0)]
    failure = Failure.of(ends, halt=3.0, stopped=[0, 1], reported=[])
    assert (failure.first, failure.followers) == (ends[1], (ends[2],))
    assert failure.stopped == (1,)  # process 0 failed on its own before the launcher stopped it
    assert (failure.lost, failure.code) == ((3,), 7)
    assert failure.describe() == (
        "process 3 failed first (exit code 7); followed by process 0 (exit code 1); "
        "stopped processes [1]"
    )


def test_reported_hardware_is_lost_too_and_signals_give_128_plus() -> None:
    ends = [Exit(1, -9, 1.0), Exit(0, 0, 1.5), Exit(2, -15, 4.0)]
    failure = Failure.of(ends, halt=2.0, stopped=[2], reported=[2, 2])
    assert (failure.lost, failure.code, failure.followers) == ((1, 2), 128 + 9, ())
    assert failure.describe() == (
        "process 1 failed (signal 9); stopped processes [2]; hardware reported lost by process 2"
    )


def test_report_hardware_lost_outside_the_launcher_tells_no_one(tmp_path: Path) -> None:
    assert distributed.report_hardware_lost({}) is False
    env = distributed.child_env(
        {"LOADAX_MESH_LOST_DIR": "/a/launcher's/own"},
        index=1,
        nprocs=2,
        devices_per_process=1,
        coordinator="127.0.0.1:1234",
        init_timeout=30,
    )
    assert "LOADAX_MESH_LOST_DIR" not in env  # a launcher's own folder is not its children's
    env["LOADAX_MESH_LOST_DIR"] = str(tmp_path)
    assert distributed.report_hardware_lost(env) is True
    assert os.listdir(tmp_path) == ["1"]


# Process 3 takes the lock, waits for the test's word, then exits with 7; the others wait for
# the lock (free once process 3 is gone), sleep a little, and exit with 1. Run 1 only prints.
FOLLOWERS = """
import fcntl, os, sys, time
e = os.environ
run, i, n = e["LOADAX_RESTART"], int(e["LOADAX_MESH_PROCESS_ID"]), e["LOADAX_MESH_NUM_PROCESSES"]
print("run", run, "of", n, flush=True)
if run != "0":
    sys.exit(0)
lock, ready, go = {lock!r}, {lock!r} + ".ready", {lock!r} + ".go"
with open({lock!r} + "." + str(i), "w") as f:
    f.write(str(os.getpid()))
fd = os.open(lock, os.O_RDWR | os.O_CREAT)
if i == 3:
    fcntl.flock(fd, fcntl.LOCK_EX)
    open(ready, "w").close()
    while not os.path.exists(go):
        time.sleep(0.01)
    sys.exit(7)
while not os.path.exists(ready):
    time.sleep(0.01)
fcntl.flock(fd, fcntl.LOCK_EX)
time.sleep(0.2)
os._exit(1)
"""


def _ended(pid: int) -> bool:
    """Whether `pid` has ended (a zombie its stopped parent has not reaped yet, or gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] in "ZX"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="the kernel's order needs pidfds")
@pytest.mark.parametrize("restarts", [1, 0])
def test_a_launcher_that_sees_every_death_at_once_names_the_first(
    tmp_path: Path, restarts: int
) -> None:
    """The launcher is stopped (SIGSTOP) while process 3 fails and the others follow, so it
    sees all four dead at once, as it may under load: the kernel's order still names process 3
    and its code, and the restart keeps the three that followed."""
    lock = str(tmp_path / "lock")
    cmd = [sys.executable, "-m", "loadax_mesh", "launch", "--nprocs", "4"]
    cmd += ["--devices-per-process", "1", "--max-restarts", str(restarts), "--min-nprocs", "2"]
    cmd += ["--", sys.executable, "-c", FOLLOWERS.format(lock=lock)]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + WAIT
        pids = [Path(f"{lock}.{i}") for i in range(4)]
        while time.monotonic() < deadline and not (
            os.path.exists(f"{lock}.ready") and all(p.exists() and p.read_text() for p in pids)
        ):
            time.sleep(0.05)
        children = [int(p.read_text()) for p in pids]
        launcher.send_signal(signal.SIGSTOP)
        try:
            Path(f"{lock}.go").touch()
            while time.monotonic() < deadline and not all(_ended(p) for p in children):
                time.sleep(0.05)
            assert all(_ended(p) for p in children)
        finally:
            launcher.send_signal(signal.SIGCONT)
        out, err = launcher.communicate(timeout=WAIT)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    said = re.search(
        r"process 3 failed first \(exit code 7\); followed by (.*); stopped processes \[\]\n", err
    )
    assert said is not None, err
    followers = sorted(said.group(1).split(", "))  # in the order they ended: any
    assert followers == [f"process {i} (exit code 1)" for i in range(3)]
    if restarts:
        assert launcher.returncode == 0, err
        assert "restart 1 of 1: the job again on 3 processes (LOADAX_RESTART=1)" in err
        assert sorted(line for line in out.splitlines() if " run 1 " in line) == [
            f"[{i}] run 1 of 3" for i in range(3)
        ]
    else:
        assert launcher.returncode == 7, err
        assert "restart" not in err


REPORTS = """
import os, sys, time
from loadax_mesh import distributed
e = os.environ
run, i, n = e["LOADAX_RESTART"], int(e["LOADAX_MESH_PROCESS_ID"]), e["LOADAX_MESH_NUM_PROCESSES"]
print("run", run, "of", n, flush=True)
if run != "0":
    sys.exit(0)
if i == 1:
    assert distributed.report_hardware_lost()
elif i == 3:
    while not os.listdir(e["LOADAX_MESH_LOST_DIR"]):
        time.sleep(0.01)
    sys.exit(4)
time.sleep(120)
"""


def test_a_process_that_reports_its_hardware_lost_is_dropped_too() -> None:
    cmd = [sys.executable, "-m", "loadax_mesh", "launch", "--nprocs", "4"]
    cmd += ["--devices-per-process", "1", "--max-restarts", "1"]
    cmd += ["--", sys.executable, "-c", REPORTS]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 0, done.stderr
    assert (
        "process 3 failed (exit code 4); stopped processes [0, 1, 2]; "
        "hardware reported lost by process 1"
    ) in done.stderr
    assert "restart 1 of 1: the job again on 2 processes (LOADAX_RESTART=1)" in done.stderr
    again = sorted(line for line in done.stdout.splitlines() if " run 1 " in line)
    assert again == ["[0] run 1 of 2", "[1] run 1 of 2"]
