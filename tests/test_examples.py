"""The strategy examples train for real: on 8 local devices, and HSDP across 2 processes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run(args, cwd=EXAMPLES, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("script", ["hsdp.py", "fsdp_tp.py", "dp_sp.py"])
def test_example_trains_on_local_devices(script):
    assert "loss" in run(sys.executable, script)


@pytest.mark.multiprocess
def test_hsdp_replicates_across_two_processes():
    out = run(
        sys.executable,
        "-m",
        "loadax_mesh",
        "launch",
        "--nprocs",
        "2",
        "--devices-per-process",
        "4",
        "--",
        sys.executable,
        "hsdp.py",
    )
    assert "replicate=2 x shard=4" in out and "loss" in out
