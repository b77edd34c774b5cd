"""The cost model's text says what its data says: the ranking marks the choices whose verdict is
"within the model's error", the compute line names the rate it is priced at, a GPU's memory
names jax's preallocated pool, and the docs' Mixtral batch is the catalogue model's (no jax)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from loadax_mesh import MeshConfig, ModelSpec, TrainSpec, choose_mesh, estimate, simulate_devices
from loadax_mesh.cost.band import UNSURE
from loadax_mesh.view.estimate import estimate_text, ranking_data, ranking_text
from loadax_mesh.view.report import size_text

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _jax_default_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        monkeypatch.delenv(name, raising=False)


def _estimate(hardware: str, model: str, batch: int) -> tuple[str, object]:
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices(hardware), selector=hardware)
    e = estimate(plan, ModelSpec.from_name(model), TrainSpec(global_batch=batch))
    return estimate_text(e, []), e


def test_the_ranking_marks_what_its_json_calls_within_the_models_error() -> None:
    # README's example: LLaMA-3 70B on a v5p-1024, whose choices 2 and 5 are within the error
    ranking = choose_mesh("tpu-v5p-1024", "llama3-70b", TrainSpec(global_batch=512))
    data = ranking_data(ranking)["choices"]
    unsure = [k for k, c in enumerate(data, 1) if c["verdict"] == UNSURE]
    assert unsure and not any(c["beyond_headroom"] for c in data)
    lines = ranking_text(ranking).splitlines()
    rows = {int(line.split(".")[0]): line for line in lines if re.match(r"\d+\.\s", line)}
    assert [k for k, line in rows.items() if " GB (~)" in line] == unsure
    legend = next(line.strip() for line in lines if line.strip().startswith("(~) "))
    assert legend.startswith(f"(~) {', '.join(map(str, unsure))}. memory within the model's error")
    assert "the model's memory error on TPU is" in legend and "compile to confirm" in legend


def test_the_compute_line_names_the_rate_it_is_priced_at() -> None:
    text, e = _estimate("tpu-v5p-16", "llama3-8b", 16)
    line = next(x for x in text.splitlines() if x.startswith("compute"))
    assert f"{e.compute_seconds * 1e3:.1f} ms at the calibrated share of the peak" in line
    assert "at peak" not in line and e.profile.device.matmul_share is None
    # an H100: the catalogue's measured shares price it (configs/hardware.toml)
    text, e = _estimate("gpu-p5.48xlarge-16", "llama3-8b", 16)
    line = next(x for x in text.splitlines() if x.startswith("compute"))
    assert e.profile.device.matmul_share is not None and e.profile.device.memory_share is not None
    assert line.endswith("ms at the chip's measured shares of its peak and of HBM bandwidth")


def test_a_gpus_memory_names_jaxs_preallocated_pool() -> None:
    text, e = _estimate("gpu-p5.48xlarge-16", "llama3-8b", 16)
    assert size_text(e.hbm_bytes) == "63.73 GB"  # an 80 GB H100
    lines = text.splitlines()
    k = next(i for i, x in enumerate(lines) if x.startswith("memory "))
    assert "of 63.73 GB" in lines[k]
    assert (
        lines[k + 1]
        .strip()
        .startswith(
            "63.73 GB: the pool jax's GPU client preallocates, 0.75 of the 84.98 GB the GPU reports"
        )
    )
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" in lines[k + 1]
    ranking = choose_mesh("gpu-p5.48xlarge-16", "tiny", TrainSpec(global_batch=16), top=2)
    assert "memory of a GPU, 63.73 GB: the pool jax's GPU client preallocates" in str(ranking)
    text, _ = _estimate("tpu-v5p-16", "llama3-8b", 16)  # a TPU's memory is its own
    assert "preallocates" not in text


def test_the_docs_say_the_mixtral_batch_the_catalogue_prices() -> None:
    tokens = ModelSpec.from_name("mixtral-8x7b").seq_len
    assert tokens == 32768
    for doc in ("README.md", "docs/cost-model.md"):
        prose = " ".join((ROOT / doc).read_text().split())
        start = prose.index("Mixtral 8x7B on four p5e hosts (32 H200s")
        batch = prose[start : prose.index("256 sequences", start) + 80]
        assert f"256 sequences of {tokens} tokens" in batch.replace("the catalogue model's ", "")
        assert "4096" not in batch, (doc, batch)
