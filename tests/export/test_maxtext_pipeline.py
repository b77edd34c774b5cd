"""MaxText's pipeline keys from a pipelined plan, checked against MaxText's own rules for them
(configs/types.py at e591f30), and the pipelines MaxText refuses."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadax_mesh import MeshConfig, simulate_devices
from loadax_mesh.cli.main import main
from loadax_mesh.errors import MeshConfigError
from loadax_mesh.plan import MeshPlan
from loadax_mesh.workload import ModelSpec, TrainSpec

LLAMA = ModelSpec.from_name("llama3-8b")


def _plan(hardware: str, batch: tuple[str, ...] = ("fsdp",)) -> MeshPlan:
    devices = simulate_devices(hardware)
    config = MeshConfig((4, len(devices) // 4), ("pipeline", "fsdp"), batch)
    return config.plan(devices, selector=hardware)


def _maxtext_accepts(keys: dict[str, str], devices: int, layers: int) -> None:
    """What MaxText's config validation asserts of the pipeline keys (types.py, section G)."""
    stages = int(keys["ici_pipeline_parallelism"]) * int(keys["dcn_pipeline_parallelism"])
    per_stage, repeats = (
        int(keys["num_layers_per_pipeline_stage"]),
        int(keys["num_pipeline_repeats"]),
    )
    pipelined, m = int(keys["pipeline_parallel_layers"]), int(keys["num_pipeline_microbatches"])
    assert stages * repeats * per_stage == pipelined <= layers
    assert m % stages == 0
    micro_batch = int(devices * float(keys["per_device_batch_size"]))  # one forward pass
    assert micro_batch % m == 0


def test_gpipe_on_one_slice_resolves_every_pipeline_key() -> None:
    plan = _plan("tpu-v5p-128")  # 64 chips: pipeline 4 x fsdp 16
    config = plan.to_maxtext(TrainSpec(global_batch=64), model=LLAMA, order=False)
    keys = config.keys
    assert (keys["ici_pipeline_parallelism"], keys["dcn_pipeline_parallelism"]) == ("4", "1")
    assert keys["ici_fsdp_parallelism"] == "16" and keys["ici_data_parallelism"] == "1"
    # 0 micro-batches is as many as stages; GPipe is one repeat of 32 / 4 layers a stage
    assert keys["num_pipeline_microbatches"] == "4" and keys["num_pipeline_repeats"] == "1"
    assert keys["num_layers_per_pipeline_stage"] == "8"
    assert keys["pipeline_parallel_layers"] == "32" and keys["scan_layers"] == "false"
    assert keys["per_device_batch_size"] == "1"  # MaxText's global batch: 1 x 64 devices
    _maxtext_accepts(keys, 64, LLAMA.num_layers)
    assert any(n.startswith("pipeline -> stage: 4 stages (GPipe)") for n in config.notes)
    assert not any("pipelines the first" in n for n in config.notes)
    # MaxText remats the iteration as one block: its backward pass holds a chunk's 8 layers
    assert any("intermediates of all 8 layers of a chunk" in n for n in config.notes)


def test_the_model_may_be_named_as_choose_mesh_takes_it() -> None:
    plan, train = _plan("tpu-v5p-128"), TrainSpec(global_batch=64)
    named = plan.to_maxtext(train, model="llama3-8b", order=False)
    assert named.keys == plan.to_maxtext(train, model=LLAMA, order=False).keys
    with pytest.raises(MeshConfigError, match="model='llama-9' is not a known model"):
        plan.to_maxtext(train, model="llama-9", order=False)


def test_the_block_remat_note_appears_only_where_a_chunk_has_several_layers() -> None:
    plan = _plan("tpu-v5p-128")
    for repeats, per_chunk in ((2, 4), (8, 1)):
        train = TrainSpec(global_batch=64, pipeline_repeats=repeats)
        config = plan.to_maxtext(train, model=LLAMA, order=False)
        assert config.keys["num_layers_per_pipeline_stage"] == str(per_chunk)
        said = [n for n in config.notes if n.startswith("memory: MaxText remats")]
        assert len(said) == (per_chunk > 1)
        assert all(f"all {per_chunk} layers" in n for n in said)
        assert all("pipeline_remat='iteration'" in n for n in said)
        # priced with MaxText's own remat, the plan's step is MaxText's: no note, same keys
        same = plan.to_maxtext(replace(train, pipeline_remat="iteration"), model=LLAMA,
                               order=False)  # fmt: skip
        assert same.keys == config.keys
        assert not [n for n in same.notes if n.startswith("memory:")]


def test_circular_over_two_slices_names_the_dcn_stages_and_the_layer_order() -> None:
    plan = _plan("tpu-v5p-128-2")  # 128 chips: pipeline 2 ICI x 2 DCN, fsdp 32
    assert plan.ici_mesh_shape == (2, 32) and plan.dcn_mesh_shape == (2, 1)
    train = TrainSpec(
        global_batch=256, pipeline_repeats=2, pipeline_layers=16, pipeline_microbatches=8
    )
    config = plan.to_maxtext(train, model=LLAMA, order=False)
    keys = config.keys
    assert (keys["ici_pipeline_parallelism"], keys["dcn_pipeline_parallelism"]) == ("2", "2")
    assert keys["dcn_fsdp_parallelism"] == "1" and keys["dcn_data_parallelism"] == "1"
    assert keys["num_pipeline_microbatches"] == "8" and keys["num_pipeline_repeats"] == "2"
    assert keys["num_layers_per_pipeline_stage"] == "2"  # 16 layers / (4 stages x 2 repeats)
    assert keys["pipeline_parallel_layers"] == "16" and keys["per_device_batch_size"] == "2"
    _maxtext_accepts(keys, 128, LLAMA.num_layers)
    assert any("MaxText pipelines the first 16 layers" in n for n in config.notes)


def test_deepseek_pipelines_its_last_moe_layers_as_maxtext_does() -> None:
    model = replace(ModelSpec.from_name("deepseek-v3"), seq_len=4096)
    train = TrainSpec(global_batch=64, pipeline_layers=56)  # 58 MoE layers after 3 dense
    config = _plan("tpu-v5p-128").to_maxtext(train, model=model, order=False)
    keys = config.keys
    assert keys["model_name"] == "deepseek3-671b" and keys["pipeline_parallel_layers"] == "56"
    assert keys["num_layers_per_pipeline_stage"] == "14"
    _maxtext_accepts(keys, 64, model.num_layers)
    assert not any("pipelines the first" in n for n in config.notes)  # the same order


def test_microbatches_maxtext_refuses_are_refused_naming_the_field() -> None:
    plan = _plan("tpu-v5p-128")
    six = TrainSpec(global_batch=192, pipeline_microbatches=6)  # the step takes 6 (>= 4)
    with pytest.raises(
        MeshConfigError,
        match=r"pipeline_microbatches=6 .6 micro-batches. is no multiple of the 4 stages.*"
        r"accepted: 0 .as many as stages. or a multiple of 4 that divides the batch, "
        r"e.g. \[4, 12\]",
    ):
        plan.to_maxtext(six, model=LLAMA, order=False)
    plan.to_maxtext(replace(six, pipeline_microbatches=12), model=LLAMA, order=False)


def test_pipelines_the_export_cannot_write_are_refused() -> None:
    plan = _plan("tpu-v5p-128")
    with pytest.raises(MeshConfigError, match=r"'pipeline' .4 stages. needs the model"):
        plan.to_maxtext(TrainSpec(global_batch=64), order=False)
    with pytest.raises(MeshConfigError, match=r"pipeline_layers=30 .* accepted: a layer count"):
        plan.to_maxtext(TrainSpec(global_batch=64, pipeline_layers=30), model=LLAMA, order=False)
    maverick = ModelSpec.from_name("llama4-maverick-17b-128e")
    with pytest.raises(MeshConfigError, match=r"mixes dense and MoE layers .* moe_every=2"):
        plan.to_maxtext(TrainSpec(global_batch=64), model=maverick, order=False)
    as_batch = _plan("tpu-v5p-128", ("pipeline", "fsdp"))
    with pytest.raises(MeshConfigError, match=r"'pipeline' is a batch axis, but MaxText's stage"):
        as_batch.to_maxtext(TrainSpec(global_batch=64), model=LLAMA, order=False)


def test_a_plan_without_a_pipeline_has_no_pipeline_keys() -> None:
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v5p-128"))
    keys = plan.to_maxtext(TrainSpec(global_batch=64), model=LLAMA, order=False).keys
    assert not [k for k in keys if "pipeline" in k] and "scan_layers" not in keys


def test_the_cli_prints_a_pipelined_plans_maxtext_keys(capsys: pytest.CaptureFixture) -> None:
    code = main(
        [
            "plan", "tpu-v5p-128", "--shape", "4,16", "--axes", "pipeline,fsdp",
            "--batch-axes", "fsdp", "--global-batch", "128", "--model", "llama3-8b",
            "--pipeline-microbatches", "8", "--pipeline-repeats", "2", "--format", "maxtext",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert "ici_pipeline_parallelism=4" in out and "num_layers_per_pipeline_stage=4" in out
    assert "num_pipeline_microbatches=8" in out and "num_pipeline_repeats=2" in out
    assert "axis pipeline (4): ring efficiency ours 1.00, MaxText's mesh_utils 1.00" in "\n".join(
        out
    )


def test_the_pipeline_preset_over_two_slices_puts_its_stages_on_dcn_in_every_export() -> None:
    hardware = "tpu-v5p-128-2"
    config = MeshConfig.from_preset("pipeline_fsdp_tp", pp=2)
    plan = config.plan(simulate_devices(hardware), selector=hardware)
    assert plan.dcn_mesh_shape[plan.axis_names.index("pipeline")] == 2
    keys = plan.to_maxtext(TrainSpec(global_batch=64), model=LLAMA, order=False).keys
    assert (keys["ici_pipeline_parallelism"], keys["dcn_pipeline_parallelism"]) == ("1", "2")
    assert keys["ici_tensor_parallelism"] == "4" and keys["num_layers_per_pipeline_stage"] == "16"
    _maxtext_accepts(keys, 128, LLAMA.num_layers)
    axlearn = plan.to_axlearn(order=False)
    assert axlearn.dcn_mesh_shape == (2, 1, 1, 1, 1, 1)
    assert axlearn.ici_mesh_shape == (1, 1, 1, 16, 1, 4)
    assert axlearn.batch_axis_names == ("fsdp",)
    assert dict(plan.to_flax_rules())["stage"] == "pipeline"


@pytest.mark.parametrize(("repeats", "closest"), [(1, "GPipe"), (2, "the circular schedule")])
def test_a_1f1b_plan_exports_the_closest_maxtext_schedule_and_says_so(repeats, closest) -> None:
    plan = _plan("tpu-v5p-128")
    fields = dict(global_batch=64, pipeline_microbatches=4, pipeline_repeats=repeats)
    one = plan.to_maxtext(TrainSpec(**fields, pipeline_schedule="1f1b"), model=LLAMA, order=False)
    gpipe = plan.to_maxtext(TrainSpec(**fields), model=LLAMA, order=False)
    assert one.keys == gpipe.keys
    lost = [n for n in one.notes if n.startswith("lost: the ") and "1F1B" in n]
    assert len(lost) == 1 and f"are {closest}" in lost[0], one.notes
    assert not any("1F1B" in n for n in gpipe.notes)
