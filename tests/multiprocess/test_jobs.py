"""Real multi-process jax jobs: `python -m loadax_mesh launch` runs tests/multiprocess/job.py.

Each job starts N processes of K CPU devices joined by jax.distributed over gloo; the checks
run inside the children (same mesh everywhere, each host's rows, a jitted global sum).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

JOB = Path(__file__).with_name("job.py")
LAUNCH_TIMEOUT = 90  # seconds the launcher allows the job (its own bound)
SPARE = 30  # seconds this test waits for the launcher beyond its own bound


def launch(
    nprocs: int, devices: int, *args: str, job: Path = JOB, timeout: int = LAUNCH_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "loadax_mesh",
        "launch",
        "--nprocs",
        str(nprocs),
        "--devices-per-process",
        str(devices),
        "--timeout",
        str(timeout),
        "--",
        sys.executable,
        str(job),
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + SPARE)


@pytest.mark.parametrize(
    ("case", "nprocs", "devices", "rows"),
    [
        ("data", 2, 4, ["0:16 shard 0/2", "16:32 shard 1/2"]),
        ("spill", 4, 2, ["0:8 shard 0/4", "8:16 shard 1/4", "16:24 shard 2/4", "24:32 shard 3/4"]),
        ("model", 2, 4, ["0:32 shard 0/1", "0:32 shard 0/1"]),
    ],
)
def test_job_loads_each_hosts_rows(case: str, nprocs: int, devices: int, rows: list[str]) -> None:
    done = launch(nprocs, devices, case)
    assert done.returncode == 0, done.stdout + done.stderr
    for i, expected in enumerate(rows):
        assert f"[{i}] OK {case}: rows {expected}" in done.stdout.splitlines(), done.stdout
    assert "[Gloo]" not in done.stdout + done.stderr  # gloo's connection messages: --verbose


def test_a_failing_process_stops_the_job() -> None:
    done = launch(2, 4, "fail")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "process 1 failed (exit code 1); stopped processes [0]" in done.stderr, done.stderr
    assert "[1] RuntimeError: process 1 fails on purpose" in done.stderr
    assert "UNREACHABLE" not in done.stdout


@pytest.mark.parametrize(("how", "code"), [("sys.exit", 3), ("raise", 1), ("os._exit", 5)])
def test_a_process_that_exits_non_zero_ends_the_job(how: str, code: int) -> None:
    # The other process sleeps: without the launcher stopping it the job would run until the
    # launcher's timeout (exit code 124), as a sys.exit(3) waiting in jax's shutdown barrier did.
    done = launch(2, 2, "end", how)
    assert done.returncode == code, done.stdout + done.stderr
    assert f"process 1 failed (exit code {code}); stopped processes [0]" in done.stderr
    assert "survived" not in done.stdout


def test_a_process_that_exits_zero_leaves_the_others_running() -> None:
    done = launch(2, 2, "end", "exit 0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[0] survived" in done.stdout.splitlines()
