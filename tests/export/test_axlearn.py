"""AXLearn's mesh fields from a plan, as values and as Python text that runs."""

from __future__ import annotations

import re

import pytest

from loadax_mesh import MeshConfig, simulate_devices
from loadax_mesh.errors import MeshConfigError
from loadax_mesh.export.axlearn import AXES
from loadax_mesh.plan import MeshPlan


def _plan(strategy: str, hardware: str) -> MeshPlan:
    return MeshConfig.from_preset(strategy).plan(simulate_devices(hardware), selector=hardware)


def _run(text: str) -> dict:
    """Execute the text with a stand-in HybridMeshShape, as AXLearn's config would."""

    class HybridMeshShape:  # the fields AXLearn's own class has
        def __init__(self, *, ici_mesh_shape: tuple, dcn_mesh_shape: tuple) -> None:
            self.ici_mesh_shape, self.dcn_mesh_shape = ici_mesh_shape, dcn_mesh_shape

    scope: dict = {"HybridMeshShape": HybridMeshShape}
    code = text.replace("from axlearn.common.utils import HybridMeshShape\n", "")
    exec(code, scope)
    return scope


def test_multislice_is_a_hybrid_mesh_shape_in_axlearn_axis_order() -> None:
    config = _plan("fsdp_tp", "tpu-v5litepod-256-2").to_axlearn(order=False)
    assert config.mesh_axis_names == AXES == ("pipeline", "data", "expert", "fsdp", "seq", "model")
    assert config.ici_mesh_shape == (1, 1, 1, 64, 1, 4)
    assert config.dcn_mesh_shape == (1, 2, 1, 1, 1, 1)
    assert config.batch_axis_names == ("data", "fsdp")
    scope = _run(config.text())
    assert scope["mesh_shape"].dcn_mesh_shape == (1, 2, 1, 1, 1, 1)
    ((regex, shape),) = scope["mesh_rules"]
    assert re.fullmatch(regex, "tpu-v5litepod-256-2") and not re.fullmatch(
        regex, "tpu-v5litepod-256"
    )
    assert shape.ici_mesh_shape == (1, 1, 1, 64, 1, 4)


def test_one_granule_is_a_plain_mesh_shape_and_the_regex_escapes_dots() -> None:
    scope = _run(_plan("fsdp", "tpu-v5p-128").to_axlearn(order=False).text())
    assert scope["mesh_shape"] == (1, 1, 1, 64, 1, 1)
    gpu = _plan("fsdp_tp", "gpu-p5.48xlarge-16").to_axlearn(order=False)
    ((regex, _),) = _run(gpu.text())["mesh_rules"]
    assert re.fullmatch(regex, "gpu-p5.48xlarge-16") and not re.fullmatch(
        regex, "gpu-p5x48xlarge-16"
    )


def test_axlearn_order_is_judged_per_granule_as_axlearn_builds_it() -> None:
    config = _plan("fsdp", "tpu-v5p-128").to_axlearn()
    assert config.order is not None and config.order.theirs is not None
    assert config.order.ours["fsdp"].efficiency == 1.0 > config.order.theirs["fsdp"].efficiency
    assert "axis fsdp (64): ring efficiency ours 1.00, AXLearn's mesh_utils" in config.text()
    # GPU granules are processes (hosts): each DCN line still enters every host once
    gpu = _plan("fsdp_tp", "gpu-p5.48xlarge-16").to_axlearn().order
    assert gpu is not None and gpu.theirs is not None and gpu.theirs["fsdp"].dcn_ok


def test_an_axis_axlearn_has_no_name_for_is_refused() -> None:
    plan = MeshConfig((2, 4), ("data", "stage"), "data").plan(simulate_devices("cpu-8"))
    with pytest.raises(MeshConfigError, match=r"mesh axis 'stage' .size 4. has no pipeline"):
        plan.to_axlearn()


def test_the_expert_axis_is_axlearns_expert_axis_and_splits_the_batch() -> None:
    config = _plan("fsdp_ep", "tpu-v5p-128").to_axlearn(order=False)
    assert dict(zip(config.mesh_axis_names, config.ici_mesh_shape, strict=True)) == {
        "pipeline": 1,
        "data": 1,
        "expert": 4,
        "fsdp": 16,
        "seq": 1,
        "model": 1,
    }
    assert config.batch_axis_names == ("expert", "fsdp")


def _pipelined(hardware: str, batch: tuple[str, ...] = ("fsdp",)) -> MeshPlan:
    devices = simulate_devices(hardware)
    config = MeshConfig((4, len(devices) // 4), ("pipeline", "fsdp"), batch)
    return config.plan(devices, selector=hardware)


@pytest.mark.parametrize(
    ("hardware", "ici", "dcn"),
    [
        ("tpu-v5p-128", (4, 1, 1, 16, 1, 1), (1, 1, 1, 1, 1, 1)),
        # two slices: the plan puts the pipeline axis across them, 2 stages a slice
        ("tpu-v5p-128-2", (2, 1, 1, 32, 1, 1), (2, 1, 1, 1, 1, 1)),
    ],
)
def test_the_pipeline_axis_is_axlearns_pipeline_axis_and_no_batch_axis(
    hardware: str, ici: tuple[int, ...], dcn: tuple[int, ...]
) -> None:
    plan = _pipelined(hardware)
    assert plan.ici_mesh_shape == (ici[0], ici[3]) and plan.dcn_mesh_shape == (dcn[0], dcn[3])
    config = plan.to_axlearn(order=False)
    assert (config.ici_mesh_shape, config.dcn_mesh_shape) == (ici, dcn)
    assert config.batch_axis_names == ("fsdp",)
    assert config.hybrid == (dcn[0] > 1)
    scope = _run(config.text())
    assert scope["batch_axis_names"] == ("fsdp",)
    shape = scope["mesh_shape"]
    assert (
        (shape.ici_mesh_shape, shape.dcn_mesh_shape) == (ici, dcn)
        if config.hybrid
        else shape == ici
    )
    assert any("Pipeline layer" in n for n in config.notes)


def test_a_pipeline_axis_among_the_batch_axes_is_refused() -> None:
    plan = _pipelined("tpu-v5p-128", ("pipeline", "fsdp"))
    with pytest.raises(MeshConfigError, match=r"include a model or pipeline axis"):
        plan.to_axlearn(order=False)
