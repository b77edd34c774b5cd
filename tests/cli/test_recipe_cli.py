"""The recipe flags: --remat (a policy or tensor=placement pairs), --microbatches and
--logits-chunks for estimate, compile and plan --strategy auto, in-process."""

from __future__ import annotations

import json

from loadax_mesh import MeshConfig, choose_mesh, simulate_devices
from loadax_mesh.cli.main import main
from loadax_mesh.cost import estimate
from loadax_mesh.workload import ModelSpec, TrainSpec

CUSTOM = "layer_input=offload,query=offload,key=offload,value=offload,out_proj=offload"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_estimate_takes_the_recipe(capsys):
    argv = ["estimate", "tpu-v6e-8", "--strategy", "fsdp", "--model", "llama3-8b"]
    recipe = ["--remat", CUSTOM, "--microbatches", "3", "--logits-chunks", "4"]
    code, out, _ = run(capsys, *argv, "--global-batch", "24", *recipe, "--format", "json")
    data = json.loads(out)
    train = TrainSpec(
        global_batch=24,
        remat=dict(p.split("=") for p in CUSTOM.split(",")),
        microbatches=3,
        logits_chunks=4,
    )
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v6e-8"))
    want = estimate(plan, ModelSpec.from_name("llama3-8b"), train)
    assert code == 0 and data["host_bytes"] == want.host_bytes > 0
    assert (data["remat"], data["microbatches"], data["logits_chunks"]) == (CUSTOM, 3, 4)
    assert data["memory_bytes"] == want.memory_bytes
    code, out, _ = run(capsys, *argv, "--global-batch", "24", *recipe)
    assert code == 0 and f"recipe     remat {CUSTOM}, microbatches 3, logits chunks 4" in out
    assert "offload    " in out and "exposed" in out and "host " in out
    code, out, _ = run(capsys, *argv, "--global-batch", "24", "--remat", "offload")
    assert code == 0 and "recipe     remat offload, microbatches 1, logits chunks 1" in out


def test_bad_recipe_flags_are_named(capsys):
    argv = ["estimate", "tpu-v5p-16", "--strategy", "fsdp", "--model", "tiny"]
    argv += ["--global-batch", "16"]
    for flags, message in (
        (["--remat", "most"], "remat='most'; accepted: full, dots, dots_attention, none, offload"),
        (["--remat", "query=offload,query=device"], "is no new tensor=placement pair"),
        (["--remat", "mlp=offload"], "tensor 'mlp' is not a named tensor"),
        (["--remat", "query=host"], "query='host'; accepted: recompute, device, offload"),
        (["--remat", "layer_input=recompute"], "the layer input is the scan's carry"),
        (["--microbatches", "0"], "'0' is not a positive integer"),
        (["--logits-chunks", "x"], "'x' is not a positive integer"),
        (["--microbatches", "3"], "microbatches=3 does not divide"),
    ):
        code, _, err = run(capsys, *argv, *flags)
        assert code == 2 and message in err, (flags, err)


def test_plan_reads_the_recipe_flags_only_for_auto(capsys):
    for flag, value in (("--remat", "offload"), ("--microbatches", "2"), ("--logits-chunks", "2")):
        code, _, err = run(capsys, "plan", "tpu-v5p-512", "--strategy", "fsdp", flag, value)
        assert code == 2 and f"plan reads {flag} only with --strategy auto" in err, err


def test_auto_finds_the_recipe_where_the_plain_step_fits_nowhere(capsys):
    argv = ["plan", "tpu-v5litepod-128", "--strategy", "auto", "--model", "llama3-8b"]
    code, out, _ = run(capsys, *argv, "--global-batch", "512", "--format", "json")
    data = json.loads(out)
    best = choose_mesh("tpu-v5litepod-128", "llama3-8b", TrainSpec(global_batch=512))
    first = data["ranking"]["choices"][0]
    assert code == 0 and first["mesh"] == best[0].estimate.mesh
    assert (first["remat"], first["microbatches"]) == (
        best[0].train.remat_text,
        best[0].train.microbatches,
    )
    code, out, _ = run(capsys, *argv, "--global-batch", "512")
    assert code == 0 and "recipe" in out.splitlines()[1]  # the ranking's recipe column
    assert f"{best[0].train.remat_text} x{best[0].train.microbatches}" in out
    assert "and recipes (--remat, --microbatches, --logits-chunks searched)" in out
    # the plain step, pinned by the flags: none fits
    plain = ["--remat", "full", "--microbatches", "1", "--logits-chunks", "1"]
    code, _, err = run(capsys, *argv, "--global-batch", "512", *plain)
    assert code == 2 and "fits no mesh" in err


def test_auto_flags_narrow_the_search_and_estimate_runs_the_winner(capsys):
    argv = ["estimate", "tpu-v5p-16", "--strategy", "auto", "--model", "tiny"]
    code, out, _ = run(capsys, *argv, "--global-batch", "16", "--remat", "dots", "--format", "json")
    data = json.loads(out)
    train = TrainSpec(global_batch=16)
    best = choose_mesh("tpu-v5p-16", "tiny", train, recipes=[{"remat": "dots"}])
    assert code == 0 and data["remat"] == "dots" and data["mesh"] == best[0].estimate.mesh
    assert data["microbatches"] == best[0].train.microbatches
    code, out, _ = run(capsys, *argv, "--global-batch", "16", "--microbatches", "2")
    assert code == 0 and "microbatches 2" in out and "(--remat, --logits-chunks searched)" in out


def test_compile_takes_the_recipe_flags(capsys, monkeypatch):
    from loadax_mesh.compiler import report

    seen = []

    def fake(plan, model, train, *, facts):  # the compile itself is tested in tests/compiler
        seen.append((train, facts))
        raise SystemExit(0)

    monkeypatch.setattr(report, "compile_step", fake)
    from loadax_mesh.hardware import topology

    monkeypatch.setattr(topology, "topology_devices", simulate_devices)  # no libtpu client here
    argv = ["compile", "tpu-v5p-16", "--strategy", "fsdp", "--model", "tiny"]
    flags = ["--remat", "layer_input=offload,mlp_in=device", "--microbatches", "2"]
    code, _, _ = run(capsys, *argv, "--global-batch", "16", *flags, "--logits-chunks", "4")
    assert code == 0 and len(seen) == 1
    t, facts = seen[0]
    assert facts is None
    assert (t.remat_text, t.microbatches, t.logits_chunks) == (
        "layer_input=offload,mlp_in=device",
        2,
        4,
    )
    # --strategy auto: the winner's recipe is what compiles
    code, _, _ = run(capsys, "compile", "tpu-v5p-16", "--strategy", "auto", "--model", "tiny",
                     "--global-batch", "16", "--remat", "dots")  # fmt: skip
    best = choose_mesh(
        "tpu-v5p-16", "tiny", TrainSpec(global_batch=16), recipes=[{"remat": "dots"}]
    )
    assert code == 0 and seen[1] == (best[0].train, None)


def test_compile_and_estimate_take_the_pipeline_flags(capsys, monkeypatch):
    from loadax_mesh.compiler import report

    seen = []

    def fake(plan, model, train, *, facts):  # the compile itself is tested in tests/compiler
        seen.append(train)
        raise SystemExit(0)

    monkeypatch.setattr(report, "compile_step", fake)
    from loadax_mesh.hardware import topology

    monkeypatch.setattr(topology, "topology_devices", simulate_devices)  # no libtpu client here
    mesh = ["--shape", "2,4", "--axes", "pipeline,fsdp", "--batch-axes", "fsdp"]
    argv = ["compile", "tpu-v5p-16", *mesh, "--model", "tiny", "--global-batch", "16"]
    flags = ["--pipeline-microbatches", "4", "--pipeline-repeats", "2", "--pipeline-layers", "0"]
    code, _, _ = run(capsys, *argv, *flags)
    assert code == 0 and len(seen) == 1
    t = seen[0]
    assert (t.pipeline_microbatches, t.pipeline_repeats, t.pipeline_layers) == (4, 2, 0)
    code, _, err = run(capsys, *argv, "--pipeline-repeats", "0")
    assert code == 2 and "'0' is not a positive integer" in err
    # the estimate prices the stages and says so; a layer count the chunks do not divide is
    # refused by name
    argv[0] = "estimate"
    code, out, _ = run(capsys, *argv, "--pipeline-microbatches", "4")
    assert code == 0
    assert "pipeline   2 stages x 1 repeat of 1 layer (2 pipelined), 4 micro-batches: 5 " in out
    assert "bubble 20.0% (S - 1) / (M R + S - 1)" in out
    code, _, err = run(capsys, *argv, *flags)
    assert code == 2 and "pipeline_layers=0 (2 layers pipelined) does not divide into 2" in err
