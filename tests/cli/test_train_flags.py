"""Every TrainSpec field is a flag of the commands that price or compile a step, made from the
dataclass: its name with dashes, its choices from the field's Literal, its help the field's
docstring, not given: TrainSpec's default (in-process, no jax)."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from loadax_mesh import MeshConfig, choose_mesh, simulate_devices
from loadax_mesh.cli.args import AUTO_SEARCHES, train_flags
from loadax_mesh.cli.main import main
from loadax_mesh.cost import estimate
from loadax_mesh.cost.choose.recipes import RECIPE_FIELDS
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.spec import DTYPES, field_docs


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


FLAGS = [f"--{f.name.replace('_', '-')}" for f in fields(TrainSpec)]


@pytest.mark.parametrize("command", ["estimate", "compile", "plan"])
def test_every_train_spec_field_is_a_flag(capsys, command):
    code, out, _ = run(capsys, command, "--help")
    assert code == 0
    missing = [flag for flag in FLAGS if flag not in out]
    assert not missing, f"TrainSpec fields without a flag in `{command} --help`: {missing}"


def test_a_flag_says_what_its_field_says():
    flags = train_flags()
    assert set(flags) == set(FLAGS) - {"--global-batch"}  # a plan flag (PLAN_FLAGS)
    docs = field_docs()
    for f in fields(TrainSpec):
        if f.name == "global_batch":
            continue
        options, text = flags[f"--{f.name.replace('_', '-')}"]
        assert text.startswith(docs[f.name]) and f"(default: {f.default})" in text
        assert options.get("default") is None  # not given: TrainSpec's default
    assert flags["--opt-state-dtype"][0]["choices"] == list(DTYPES)
    # what --strategy auto searches unless given is the search's recipe fields
    assert set(AUTO_SEARCHES) == set(RECIPE_FIELDS)


def test_estimate_prices_bfloat16_optimizer_states(capsys):
    argv = ["estimate", "tpu-v5p-16", "--strategy", "fsdp", "--model", "tiny"]
    argv += ["--global-batch", "16", "--format", "json"]
    code, out, err = run(capsys, *argv, "--opt-state-dtype", "bfloat16")
    assert code == 0, err
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v5p-16"))
    model = ModelSpec.from_name("tiny")
    half = estimate(plan, model, TrainSpec(global_batch=16, opt_state_dtype="bfloat16"))
    whole = estimate(plan, model, TrainSpec(global_batch=16))
    data = json.loads(out)
    assert data["terms"]["optimizer"] == half.terms["optimizer"]
    assert 2 * half.terms["optimizer"] == whole.terms["optimizer"]
    code, out, _ = run(capsys, *argv)
    assert code == 0 and json.loads(out)["terms"]["optimizer"] == whole.terms["optimizer"]


def test_the_other_new_flags_reach_the_train_spec(capsys, monkeypatch):
    from loadax_mesh.compiler import report
    from loadax_mesh.hardware import topology

    seen = []

    def fake(plan, model, train, *, facts):  # the compile itself is tested in tests/compiler
        seen.append(train)
        raise SystemExit(0)

    monkeypatch.setattr(report, "compile_step", fake)
    monkeypatch.setattr(topology, "topology_devices", simulate_devices)  # no libtpu client here
    argv = ["compile", "tpu-v5p-16", "--strategy", "fsdp", "--model", "tiny"]
    flags = ["--param-dtype", "bfloat16", "--compute-dtype", "float32", "--learning-rate", "3e-4"]
    flags += ["--capacity-factor", "2", "--routing", "balanced", "--moe", "capacity"]
    code, _, err = run(capsys, *argv, "--global-batch", "16", *flags)
    assert code == 0, err
    assert seen == [
        TrainSpec(
            global_batch=16,
            param_dtype="bfloat16",
            compute_dtype="float32",
            learning_rate=3e-4,
            capacity_factor=2.0,
            routing="balanced",
            moe="capacity",
        )
    ]
    for bad, said in (
        (["--learning-rate", "-1"], "'-1' is not a positive finite number"),
        (["--capacity-factor", "inf"], "'inf' is not a positive finite number"),
        (["--param-dtype", "float16"], "invalid choice: 'float16'"),
    ):
        code, _, err = run(capsys, *argv, "--global-batch", "16", *bad)
        assert code == 2 and said in err, (bad, err)


def test_plan_refuses_a_train_flag_it_would_not_read(capsys):
    code, _, err = run(capsys, "plan", "tpu-v5p-16", "--strategy", "fsdp", "--opt-state-dtype",
                       "bfloat16")  # fmt: skip
    assert code == 2 and "plan reads --opt-state-dtype only with --strategy auto" in err
    # --format maxtext reads them all: MaxText's keys carry the recipe
    argv = ["plan", "tpu-v5p-16", "--strategy", "fsdp", "--global-batch", "16"]
    code, out, err = run(capsys, *argv, "--format", "maxtext", "--param-dtype", "bfloat16",
                         "--opt-state-dtype", "bfloat16")  # fmt: skip
    assert code == 0 and "weight_dtype=bfloat16" in out, err


def test_auto_prices_the_flags_and_passes_its_winner_on(capsys):
    argv = ["estimate", "tpu-v5p-16", "--strategy", "auto", "--model", "tiny"]
    argv += ["--global-batch", "16", "--opt-state-dtype", "bfloat16", "--format", "json"]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    best = choose_mesh("tpu-v5p-16", "tiny", TrainSpec(global_batch=16, opt_state_dtype="bfloat16"))
    assert best[0].train.opt_state_dtype == "bfloat16"
    data = json.loads(out)
    assert data["mesh"] == best[0].estimate.mesh
    assert data["memory_bytes"] == best[0].estimate.memory_bytes
    assert (data["remat"], data["microbatches"]) == (
        best[0].train.remat_text,
        best[0].train.microbatches,
    )
