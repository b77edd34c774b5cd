"""The fit verdict with the memory model's measured error: the band per platform read from the
referee rows (configs/memory_referees.toml), three verdicts, the command that confirms one, and
choose_mesh keeping the candidates the band leaves possible. No jax needed."""

from __future__ import annotations

import json

import pytest

from loadax_mesh import MeshConfig, choose_mesh, simulate_devices
from loadax_mesh.cli.main import main
from loadax_mesh.cost import estimate
from loadax_mesh.cost.band import (
    DOES_NOT_FIT,
    FITS,
    MIN_COMPILED_BYTES,
    UNSURE,
    Band,
    fit_verdict,
    memory_band,
    referee_rows,
)
from loadax_mesh.cost.referees import referee_estimate
from loadax_mesh.workload import ModelSpec, TrainSpec


@pytest.mark.parametrize("k", range(len(referee_rows())))
def test_each_referee_rows_estimate_is_the_cost_models(k):
    """A row's estimate must be what the model says now, else the band measures an old model:
    `python benchmarks/bench_cost.py --refresh-rows configs/memory_referees.toml` rewrites them."""
    row = referee_rows()[k]
    assert referee_estimate(row) == row["estimate_bytes"], row


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_the_band_is_the_spread_of_the_rows(platform):
    ratios = [
        r["estimate_bytes"] / r["compiled_bytes"]
        for r in referee_rows()
        if r["platform"] == platform and r["compiled_bytes"] >= MIN_COMPILED_BYTES
    ]
    band = memory_band(platform)
    if not ratios:
        assert band is None
        return
    assert band is not None and band.rows == len(ratios)
    assert band.low == min(1.0, *ratios) and band.high == max(1.0, *ratios)
    assert "referee rows" in band.text()


def test_three_verdicts():
    band = Band("gpu", low=0.9, high=1.2, rows=3)
    capacity = 100.0
    assert fit_verdict(90.0, capacity, band) == FITS  # even 90 / 0.9 = 100 fits
    assert fit_verdict(95.0, capacity, band) == UNSURE  # fits as estimated, 105.6 if it errs
    assert fit_verdict(110.0, capacity, band) == UNSURE  # over, but 91.7 if it errs the other way
    assert fit_verdict(121.0, capacity, band) == DOES_NOT_FIT  # even 100.8 does not fit
    assert fit_verdict(101.0, capacity, None) == DOES_NOT_FIT  # no rows: the estimate decides
    assert fit_verdict(100.0, capacity, None) == FITS


def _gpu(batch: int):
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("gpu-p5e.48xlarge-8"))
    return estimate(plan, ModelSpec.from_name("llama3-8b"), TrainSpec(global_batch=batch,
                                                                      remat="dots"))  # fmt: skip


def test_verdicts_run_from_fits_to_does_not_fit_as_memory_grows(capsys):
    found = [_gpu(8 * k) for k in range(1, 17)]
    assert [e.memory_bytes for e in found] == sorted(e.memory_bytes for e in found)
    order = {FITS: 0, UNSURE: 1, DOES_NOT_FIT: 2}
    verdicts = [e.verdict for e in found]
    assert [order[v] for v in verdicts] == sorted(order[v] for v in verdicts)
    assert set(verdicts) == {FITS, UNSURE, DOES_NOT_FIT}
    for e in found:
        assert e.fits == (e.memory_bytes <= e.hbm_bytes)  # the point estimate, as before
        assert (e.confirm is not None) == (e.verdict == UNSURE)
    # The command to confirm describes the same step: estimated, it gives the same memory.
    unsure = next(e for e in found if e.verdict == UNSURE)
    words = unsure.confirm.split()
    assert words[:2] == ["loadax-mesh", "compile"]
    assert main(["estimate", *words[2:], "--format", "json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["memory_bytes"] == unsure.memory_bytes and again["verdict"] == UNSURE
    assert main(["estimate", *words[2:]]) == 0
    text = capsys.readouterr().out
    assert "within the model's error: compile to confirm" in text
    assert f"confirm    {unsure.confirm}" in text and "the model's memory error on GPU" in text


def test_choose_mesh_keeps_what_the_band_leaves_possible_ranked_last():
    hardware, model = "gpu-p5e.48xlarge-8", ModelSpec.from_name("llama3-8b")
    band = memory_band("gpu")
    assert band is not None and band.high > 1
    ranking = choose_mesh(hardware, model, TrainSpec(global_batch=64), top=60, headroom=0.5)
    beyond = [c.beyond_headroom for c in ranking]
    assert any(beyond) and not all(beyond)
    assert beyond == sorted(beyond)  # every choice within the headroom first
    for c in ranking:
        e = c.estimate
        assert c.unsure == c.beyond_headroom  # nothing here assumes a fact
        if c.beyond_headroom:
            assert 0.5 * e.hbm_bytes < e.memory_bytes <= e.hbm_bytes * band.high
            assert e.verdict != DOES_NOT_FIT
        else:
            assert e.memory_bytes <= 0.5 * e.hbm_bytes
