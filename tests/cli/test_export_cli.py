"""`loadax-mesh plan ... --format maxtext|axlearn|flax`."""

from __future__ import annotations

import pytest

from loadax_mesh import MeshConfig, simulate_devices
from loadax_mesh.cli.main import main
from loadax_mesh.workload import ModelSpec, TrainSpec
from tests.helpers import run_python


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def keys(out: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in out.splitlines() if not line.startswith("#"))


def test_maxtext_format_prints_the_library_export(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "tpu-v5p-128", "--strategy", "fsdp_tp", "--global-batch", "64"]
    recipe = ["--model", "llama3-8b", "--remat", "layer_input=offload", "--microbatches", "2"]
    code, out, err = run(capsys, *argv, *recipe, "--format", "maxtext")
    assert code == 0, err
    plan = MeshConfig.from_preset("fsdp_tp").plan(
        simulate_devices("tpu-v5p-128"), selector="tpu-v5p-128"
    )
    train = TrainSpec(global_batch=64, remat={"layer_input": "offload"}, microbatches=2)
    expected = plan.to_maxtext(train, model=ModelSpec.from_name("llama3-8b"))
    assert out.strip() == expected.text()
    got = keys(out)
    assert got["ici_fsdp_parallelism"] == "16" and got["ici_tensor_parallelism"] == "4"
    assert got["per_device_batch_size"] == "0.5" and got["gradient_accumulation_steps"] == "2"
    assert got["decoder_layer_input"] == "offload"
    assert "# lost: the device order" in out


def test_maxtext_format_after_auto_carries_the_chosen_recipe(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["plan", "tpu-v5litepod-8", "--strategy", "auto", "--model", "tiny"]
    code, out, err = run(capsys, *argv, "--global-batch", "16", "--remat", "offload", "--format",
                         "maxtext")  # fmt: skip
    assert code == 0, err
    got = keys(out)
    assert got["remat_policy"] == "custom" and got["decoder_layer_input"] == "offload"
    assert got["base_emb_dim"] == "128"  # tiny is no MaxText model: its shape is written out
    assert float(got["per_device_batch_size"]) * 8 * int(got["gradient_accumulation_steps"]) == 16


def test_maxtext_format_needs_the_global_batch(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", "tpu-v5p-128", "--strategy", "fsdp", "--format", "maxtext")
    assert code == 2 and "--format maxtext needs --global-batch" in err


@pytest.mark.parametrize(
    ("fmt", "extra", "code", "said"),
    [
        ("maxtext", [], 2, "--format maxtext needs --global-batch"),
        ("maxtext", ["--model", "llama3-8b"], 2, "--format maxtext needs --global-batch"),
        ("maxtext", ["--global-batch", "256"], 0, ""),
        ("maxtext", ["--global-batch", "256", "--model", "llama3-8b"], 0, ""),
        ("maxtext", ["--global-batch", "256", "--fact", "hbm=10"], 2, "--format maxtext reads"),
        ("axlearn", [], 0, ""),
        ("axlearn", ["--model", "llama3-8b"], 2, "--format axlearn reads none of them"),
        ("axlearn", ["--global-batch", "256"], 2, "plan reads --global-batch only with"),
        ("flax", [], 0, ""),
        ("flax", ["--remat", "dots"], 2, "--format flax reads none of them"),
        ("flax", ["--global-batch", "256"], 2, "plan reads --global-batch only with"),
        ("text", ["--global-batch", "256"], 0, ""),
        ("json", ["--model", "llama3-8b"], 2, "--format json reads --global-batch (each host"),
    ],
)
def test_one_rule_for_what_each_format_reads(capsys, fmt, extra, code, said) -> None:
    """Outside --strategy auto a flag is taken where the format uses it and refused where not:
    maxtext needs the batch and takes the model and recipe, the reports read the batch, and
    axlearn and flax (the mesh alone) read neither."""
    argv = ["plan", "tpu-v5p-512", "--strategy", "fsdp", "--format", fmt, *extra]
    got, out, err = run(capsys, *argv)
    assert got == code and said in err, err
    assert (out != "") == (code == 0)


def test_axlearn_and_flax_after_auto_take_what_chose_the_mesh(capsys) -> None:
    auto = ["--strategy", "auto", "--model", "tiny", "--global-batch", "16"]
    for fmt in ("axlearn", "flax"):
        code, out, err = run(capsys, "plan", "tpu-v5p-16", *auto, "--format", fmt)
        assert code == 0 and out.startswith("# "), err


def test_a_plan_maxtext_cannot_express_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "cpu-8", "--shape", "2,4", "--axes", "data,stage", "--global-batch", "8"]
    code, _, err = run(capsys, *argv, "--format", "maxtext")
    assert code == 2 and "mesh axis 'stage' (size 4) has no MaxText name" in err


def test_axlearn_format_is_a_hybrid_mesh_rule(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys, "plan", "tpu-v5p-64-2", "--strategy", "fsdp", "--format", "axlearn"
    )
    assert code == 0, err
    assert "mesh_shape = HybridMeshShape(ici_mesh_shape=(1, 1, 1, 32, 1, 1), " in out
    assert "dcn_mesh_shape=(1, 2, 1, 1, 1, 1))" in out
    assert '(r"tpu-v5p-64-2", HybridMeshShape(' in out


def test_flax_format_prints_rules_without_jax() -> None:
    out = run_python(
        "import sys\n"
        "from loadax_mesh.cli.main import main\n"
        "main(['plan', 'tpu-v5p-128', '--strategy', 'fsdp_tp', '--format', 'flax'])\n"
        "assert 'jax' not in sys.modules, 'the flax rules imported jax'\n"
    )
    assert "    ('embed', 'fsdp'),\n" in out and "    ('mlp', 'model'),\n" in out
    assert "    ('kv', None),\n" in out
