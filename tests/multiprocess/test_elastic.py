"""Elastic training under the launcher: 4 processes of 2 CPU devices train the tiny model,
one is killed at a chosen step, the job restarts on the 3 left, replans, restores the Orbax
checkpoint resharded, and ends where an uninterrupted run ends: the same losses step by step
and the same parameters, every step's data used once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS, SAVE_EVERY, DIE_AT = 5, 2, 4  # checkpoints after steps 2 and 4; process 3 dies at step 4


def start(*args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.Popen(
        args, cwd=EXAMPLES, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    """Its exit code, stdout and stderr (killed if it outlives the bound)."""
    try:
        out, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


def losses(stdout: str, prefix: str = "") -> dict[int, dict[int, float]]:
    """run -> step -> loss, from process 0's `run R step S loss L` lines."""
    found: dict[int, dict[int, float]] = {}
    for r, s, loss in re.findall(
        rf"^{re.escape(prefix)}run (\d+) step (\d+) loss (\S+)$", stdout, re.M
    ):
        found.setdefault(int(r), {})[int(s)] = float(loss)
    return found


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_lost_process_resumes_on_the_rest_with_nothing_lost(tmp_path: Path) -> None:
    common = ["--steps", str(STEPS), "--save-every", str(SAVE_EVERY)]
    # the uninterrupted run (8 devices in one process, the same data x fsdp = 4 x 2 mesh) runs
    # beside the elastic job
    ref = start(
        sys.executable, "elastic.py", "--ckpt", str(tmp_path / "ref"), *common,
        "--out", str(tmp_path / "ref.npz"),
    )  # fmt: skip
    job = start(
        sys.executable, "-m", "loadax_mesh", "launch", "--nprocs", "4",
        "--devices-per-process", "2", "--max-restarts", "1", "--min-nprocs", "2",
        "--timeout", "300", "--",
        sys.executable, "elastic.py", "--ckpt", str(tmp_path / "job"), *common,
        "--die-at", str(DIE_AT), "--out", str(tmp_path / "job.npz"),
    )  # fmt: skip
    code, ref_out, ref_err = finish(ref)
    assert code == 0, ref_out + ref_err
    expected = losses(ref_out)
    assert list(expected) == [0] and sorted(expected[0]) == list(range(1, STEPS + 1))
    code, out, err = finish(job)
    assert code == 0, out + err
    # the peers jax's runtime ends after process 3 are not lost: the job restarts on 3
    assert re.search(r"process 3 failed (first )?\(signal 9\)", err), err
    assert "restart 1 of 1: the job again on 3 processes (LOADAX_RESTART=1)" in err
    # the first run: 4 processes, 3 rows a device; the second: replan keeps the batch of 12
    # on data=3 with 2 micro-batches (2 rows a device, within the budget of 3)
    assert "[0] run 0: 4 processes, mesh {'data': 4, 'fsdp': 2}, 1 micro-batches" in out
    assert "[0] run 1: 3 processes, mesh {'data': 3, 'fsdp': 2}, 2 micro-batches" in out
    assert "[0] run 1: restored step 2" in out
    for run_, rows in ((0, ["0:3", "3:6", "6:9", "9:12"]), (1, ["0:4", "4:8", "8:12"])):
        for i, span in enumerate(rows):  # each host its own rows, together the whole batch
            assert f"[{i}] run {run_}: process {i} loads rows {span}" in out

    got = losses(out, "[0] ")
    # the first run trained steps 1-3 (step 3, after the last checkpoint, is lost with it;
    # process 0 may be stopped before it prints it); the second resumed after the checkpoint
    # of step 2: no step skipped, none applied twice to the state it continues
    assert sorted(got[0])[:2] == [1, 2] and set(got[0]) <= {1, 2, 3}
    assert sorted(got[1]) == [3, 4, 5]
    for run_ in (0, 1):
        for step, loss in got[run_].items():
            np.testing.assert_allclose(loss, expected[0][step], rtol=1e-5, err_msg=f"step {step}")

    want, have = np.load(tmp_path / "ref.npz"), np.load(tmp_path / "job.npz")
    assert sorted(want.files) == sorted(have.files) and len(want.files) > 5
    for name in want.files:
        np.testing.assert_allclose(have[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_process_killed_inside_a_save_resumes_from_the_last_complete_step(
    tmp_path: Path,
) -> None:
    """Process 3 is killed (SIGKILL) inside the save of step 4, its part written to Orbax's
    temporary directory: the step is never committed, the restart resumes from step 2, and the
    losses equal an uninterrupted run's."""
    common = ["--steps", str(STEPS), "--save-every", str(SAVE_EVERY)]
    ref = start(sys.executable, "elastic.py", "--ckpt", str(tmp_path / "ref"), *common)
    job = start(
        sys.executable, "-m", "loadax_mesh", "launch", "--nprocs", "4",
        "--devices-per-process", "2", "--max-restarts", "1", "--min-nprocs", "2",
        "--timeout", "300", "--",
        sys.executable, "elastic.py", "--ckpt", str(tmp_path / "job"), *common,
        "--die-in-save", "4",
    )  # fmt: skip
    code, ref_out, ref_err = finish(ref)
    assert code == 0, ref_out + ref_err
    expected = losses(ref_out)[0]
    code, out, err = finish(job)
    assert code == 0, out + err
    assert "[3] process 3 killed inside the save" in out
    assert re.search(r"process 3 failed (first )?\(signal 9\)", err), err
    assert "restart 1 of 1: the job again on 3 processes (LOADAX_RESTART=1)" in err
    # step 4's partial checkpoint was on disk when the restart looked, and was passed over
    assert "[0] run 1: restored step 2; uncommitted, not read: 4.orbax-checkpoint-tmp" in out
    got = losses(out, "[0] ")
    assert set(got[0]) <= {1, 2, 3, 4} and sorted(got[1]) == [3, 4, 5]
    for run_ in (0, 1):
        for step, loss in got[run_].items():
            np.testing.assert_allclose(loss, expected[step], rtol=1e-5, err_msg=f"step {step}")
