"""`loadax-mesh models`, `estimate` and `plan/compile --strategy auto`, in-process."""

from __future__ import annotations

import json

import pytest

from loadax_mesh import MeshConfig, choose_mesh, simulate_devices
from loadax_mesh.cli.main import main
from loadax_mesh.cost import estimate
from loadax_mesh.view.report import size_text
from loadax_mesh.workload import ModelSpec, TrainSpec, list_models


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_models(capsys):
    code, out, _ = run(capsys, "models", "--format", "json")
    data = json.loads(out)
    assert code == 0 and [m["name"] for m in data] == list_models()
    assert {m["name"]: m["num_params"] for m in data}["llama3-8b"] == 8_030_261_248
    code, out, _ = run(capsys, "models")
    assert code == 0 and "llama3-405b" in out and "405.85B" in out


def test_estimate_matches_the_api(capsys):
    argv = ["estimate", "tpu-v5p-512", "--strategy", "fsdp", "--model", "llama3-8b"]
    code, out, _ = run(capsys, *argv, "--global-batch", "256", "--format", "json")
    data = json.loads(out)
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v5p-512"))
    want = estimate(plan, ModelSpec.from_name("llama3-8b"), TrainSpec(global_batch=256))
    assert code == 0 and data["memory_bytes"] == want.memory_bytes
    assert data["axes"]["fsdp"]["bytes"] == want.axes["fsdp"].bytes
    code, out, _ = run(capsys, *argv, "--global-batch", "256")
    assert code == 0 and "bottleneck" in out and "fsdp" in out and "MFU" in out


def test_estimate_needs_a_model_and_batch(capsys):
    code, _, err = run(capsys, "estimate", "tpu-v5p-16", "--strategy", "fsdp", "--model", "tiny")
    assert code == 2 and "--global-batch" in err
    code, _, err = run(
        capsys, "estimate", "tpu-v5p-16", "--strategy", "fsdp", "--model", "gpt5",
        "--global-batch", "8",
    )  # fmt: skip
    assert code == 2 and "model='gpt5' is not a known model" in err


def test_workload_flags_name_what_is_missing_and_plan_reads_them_only_for_auto(capsys, monkeypatch):
    from loadax_mesh.hardware import topology

    monkeypatch.setattr(topology, "topology_devices", simulate_devices)  # no libtpu client here
    code, _, err = run(capsys, "plan", "tpu-v5p-512", "--strategy", "auto", "--model", "tiny")
    assert code == 2 and "plan --strategy auto needs --global-batch B (to choose" in err
    assert "--model M" not in err
    code, _, err = run(capsys, "compile", "tpu-v5p-512", "--strategy", "fsdp", "--model", "tiny")
    assert code == 2 and "compile needs --global-batch B (for the step it compiles)" in err
    for flag, value in (("--model", "llama3-7b"), ("--remat", "dots"), ("--attention", "plain")):
        code, _, err = run(capsys, "plan", "tpu-v5p-512", "--strategy", "fsdp", flag, value)
        assert code == 2 and f"plan reads {flag} only with --strategy auto" in err, err


def test_plan_auto_ranks_then_plans_the_winner(capsys):
    argv = ["plan", "tpu-v5p-128", "--strategy", "auto", "--model", "llama3-8b"]
    code, out, _ = run(capsys, *argv, "--global-batch", "64", "--format", "json")
    data = json.loads(out)
    best = choose_mesh("tpu-v5p-128", ModelSpec.from_name("llama3-8b"), TrainSpec(global_batch=64))
    assert code == 0 and data["ici_mesh_shape"] == list(best[0].ici)
    assert data["ranking"]["choices"][0]["mesh"] == best[0].estimate.mesh
    assert data["ranking"]["considered"] == best.considered
    code, out, _ = run(capsys, *argv, "--global-batch", "64")
    assert code == 0 and out.startswith("ranking    ") and "\nmesh       " in out
    code, _, err = run(capsys, *argv, "--global-batch", "64", "--shape", "8,8")
    assert code == 2 and "drop --shape" in err


@pytest.mark.compile
@pytest.mark.slow
def test_compile_auto_compiles_a_winner_that_fits(capsys):
    argv = ["compile", "tpu-v5litepod-8", "--strategy", "auto", "--model", "tiny"]
    code, out, _ = run(capsys, *argv, "--global-batch", "64", "--format", "json")
    data = json.loads(out)
    best = choose_mesh("tpu-v5litepod-8", ModelSpec.from_name("tiny"), TrainSpec(global_batch=64))
    assert code == 0 and data["fits"] is True and data["mesh"] == best[0].estimate.mesh
    # libtpu's own buffer assignment, carried and printed beside memory_analysis()'s sum
    assert data["argument_bytes"] < data["assigned_bytes"] <= data["total_bytes"]
    code, out, _ = run(capsys, *argv, "--global-batch", "64")
    assigned = size_text(data["assigned_bytes"])
    assert code == 0 and f"libtpu assigns {assigned} (arguments and its temp block" in out


def test_auto_refuses_the_flags_it_would_ignore_and_strategy_is_named(capsys):
    argv = ["plan", "tpu-v5p-128", "--strategy", "auto", "--model", "tiny", "--global-batch", "64"]
    for extra, flag in (
        (["--set", "fsdp=4"], "--set"),
        (["--granule", "none"], "--granule"),
        (["--batch-axes", "data"], "--batch-axes"),
    ):
        code, _, err = run(capsys, *argv, *extra)
        assert code == 2 and f"drop {flag}" in err, err
    code, _, err = run(capsys, "estimate", "tpu-v5p-16", "--model", "tiny", "--global-batch", "8")
    assert code == 2 and "estimate needs --strategy (one of auto, " in err


def test_estimate_shows_small_sizes_in_mb(capsys):
    argv = ["estimate", "tpu-v5litepod-8", "--strategy", "fsdp", "--model", "tiny"]
    code, out, _ = run(capsys, *argv, "--global-batch", "64")
    terms = next(line for line in out.splitlines() if line.lstrip().startswith("params "))
    assert code == 0 and " MB" in terms and "0.00 GB" not in terms


@pytest.mark.slow  # three searches of 512 GPUs, about a second of CPU each
def test_plan_auto_searches_pipelines_and_prints_their_terms_and_stages(capsys):
    # 64 H100 hosts on a 10 Gb/s network a GPU: the default search weighs stages across hosts
    hardware, slow = "gpu-p5.48xlarge-512", "network_per_gpu=10Gbps"
    argv = ["plan", hardware, "--strategy", "auto", "--model", "llama3-70b"]
    argv += ["--global-batch", "512", "--fact", slow]
    facts = {"network_per_gpu": "10Gbps"}
    best = choose_mesh(hardware, "llama3-70b", TrainSpec(global_batch=512), facts=facts)
    p = best[0].estimate.pipeline
    assert p is not None  # the premise: a pipeline wins here (tests/cost/test_choose_pipeline.py)
    code, out, _ = run(capsys, *argv)
    assert code == 0
    assert "pipelines  searched across granules: 2, 4, 8, 16 stages" in out
    assert f"pp{p.stages} M{p.microbatches} R{p.repeats}: bubble {p.bubble:.1%}" in out
    assert "stage-to-stage" in out and "the pipeline wins by" in out
    # the note carries the pipeline's recipe fields, searched since none was given
    note = next(line for line in out.splitlines() if line.startswith("note       strategy auto"))
    assert "--pipeline-microbatches, --pipeline-repeats searched" in note
    assert (
        f"pipeline {p.stages} stages, pipeline microbatches {p.microbatches}, pipeline repeats "
        f"{p.repeats} (bubble {p.bubble:.1%})"
    ) in note
    # the report lists each stage's hosts: whole hosts, one run of them per stage
    stages = [line.split() for line in out.splitlines() if line.startswith("             stage ")]
    assert len(stages) == p.stages
    per = 64 // p.stages
    for s, words in enumerate(stages):
        assert words[:2] == ["stage", f"{s}:"]
        assert f"{s * per}-{(s + 1) * per - 1}," in words  # its hosts
    # a pinned pipeline field pins the search's
    other = 1 if p.repeats > 1 else 2
    code, out, _ = run(capsys, *argv, "--pipeline-repeats", str(other), "--format", "json")
    data = json.loads(out)
    staged = [c["pipeline"] for c in data["ranking"]["choices"] if c["pipeline"]]
    assert code == 0 and staged
    assert all(s["repeats"] == other for s in staged)
    assert data["ranking"]["pipeline_stages_searched"] == [2, 4, 8, 16]


def test_pipeline_flags_on_the_command_line(capsys):
    """--axes with a pipeline axis first: the default batch axis is the next one (stages never
    split the batch); the stage lines name hosts without a granule kind that says nothing;
    --pipeline-remat reaches the estimate (none under remat none: nothing is checkpointed);
    --pipeline-* on a plan without stages is refused, naming the flag."""
    staged = ["tpu-v5p-128", "--axes", "pipeline,fsdp", "--shape", "4,16"]
    code, out, _ = run(capsys, "plan", *staged)
    assert code == 0 and "batch      * axes fsdp: data-parallel degree 16" in out
    assert "stage 0: hosts 0-3, device ids 0-15" in out and "stage 0: none" not in out
    work = ["--model", "llama3-8b", "--global-batch", "64"]
    code, out, _ = run(capsys, "estimate", *staged, *work, "--pipeline-remat", "iteration")
    assert code == 0 and "4 micro-batches, one checkpoint an iteration:" in out
    assert "iteration residuals" in out
    code, out, _ = run(
        capsys, "estimate", *staged, *work, "--pipeline-remat", "iteration", "--remat", "none"
    )
    assert code == 0 and "one checkpoint an iteration" not in out
    plain = ["tpu-v5p-128", "--strategy", "fsdp", *work]
    for command in (["estimate"], ["plan", "--format", "maxtext"]):
        code, _, err = run(capsys, *command, *plain, "--pipeline-repeats", "2")
        assert code == 2
        assert "--pipeline-repeats is read only on a mesh with a pipeline axis larger than 1" in err


def test_plan_auto_marks_the_facts_the_user_gave(capsys):
    argv = ["plan", "gpu-p5.48xlarge-16", "--strategy", "auto", "--model", "llama3-8b"]
    code, out, _ = run(capsys, *argv, "--global-batch", "16", "--fact", "network_per_gpu=100Gbps")
    assert code == 0
    assert out.startswith("given      network_per_gpu = 100 Gbps (given by the user)\nranking ")
    code, out, _ = run(capsys, *argv, "--global-batch", "16")
    assert code == 0 and "given by the user" not in out


def test_plan_auto_says_when_a_pinned_pipeline_field_fits_no_pipeline(capsys):
    """Two hosts search 2 stages; 2 x 3 repeats divide none of LLaMA-3 8B's 32 layers."""
    argv = ["plan", "gpu-p5.48xlarge-16", "--strategy", "auto", "--model", "llama3-8b"]
    code, out, _ = run(capsys, *argv, "--global-batch", "16", "--pipeline-repeats", "3")
    assert code == 0 and "pipelines  searched across granules: 2 stages" in out
    assert "no pipelined mesh was priced with --pipeline-repeats 3 (stages x repeats" in out
    code, out, _ = run(capsys, *argv, "--global-batch", "16", "--pipeline-repeats", "2")
    assert code == 0 and "no pipelined mesh was priced" not in out
