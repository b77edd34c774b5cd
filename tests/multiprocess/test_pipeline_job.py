"""Pipeline stages across processes: `loadax-mesh launch` runs tests/multiprocess/pipeline_job.py
on 2 processes of 4 CPU devices, the pipeline axis (2 stages) across them and fsdp (4) inside
each, so the stage-to-stage collective-permutes cross processes (gloo); its losses are one
device's, under GPipe and 1F1B."""

from __future__ import annotations

import re
from dataclasses import replace

import jax
import numpy as np
import pytest

from loadax_mesh import MeshConfig
from loadax_mesh.workload import ModelSpec, TrainSpec

from ..workload.losses import step_losses
from .test_jobs import JOB, launch

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

PIPELINE_JOB = JOB.with_name("pipeline_job.py")


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_pipeline_across_two_processes_trains_like_one_device(schedule: str) -> None:
    done = launch(2, 4, schedule, job=PIPELINE_JOB, timeout=300)  # two compiles, small machine
    assert done.returncode == 0, done.stdout + done.stderr
    got = [float(x) for x in re.findall(r"^\[0\] step \d+ loss (\S+)$", done.stdout, re.M)]
    assert len(got) == 3, done.stdout
    model = replace(ModelSpec.from_name("tiny"), num_layers=4)
    train = TrainSpec(global_batch=8, learning_rate=1e-2, compute_dtype="float32")
    single = MeshConfig((1,), ("data",)).plan(jax.devices()[:1])
    expected = step_losses(single, model, train, batch_axes=("data",), steps=3)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
