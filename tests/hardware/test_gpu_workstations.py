"""GPU sets the catalogue does not list: 1, 2 or 4 GPUs, an unknown kind, jobs cut down to a
few GPUs (issue 12). The stand-ins copy what jax 0.11.2 reports for a real H100 (standins.JaxGpu).

Detection names them with a generic selector, every preset plans on them, batches shard on
them, and the CLI's `devices` and `plan --devices local` run; an 8-GPU H100 host keeps its
catalogue name.
"""

from __future__ import annotations

import json
import math

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from loadax_mesh import (
    MeshConfig,
    MeshConfigError,
    MeshPlan,
    detect_hardware,
    host_batch_slice,
    list_presets,
    plan_mesh,
    shard_batch,
)
from loadax_mesh.cli.main import main
from loadax_mesh.presets import get_preset
from tests.standins import jax_gpus

RTX = "NVIDIA GeForce RTX 4090"
SETS = {  # name: (devices, the selector detection gives)
    "1 GPU": (jax_gpus(1, 1), "gpu-nvidia-h100-80gb-hbm3-1"),
    "2 GPUs": (jax_gpus(1, 2), "gpu-nvidia-h100-80gb-hbm3-2"),
    "4 GPUs": (jax_gpus(1, 4), "gpu-nvidia-h100-80gb-hbm3-4"),
    "8 GPUs, one host": (jax_gpus(1, 8), "gpu-p5.48xlarge-8"),
    "2 processes of 4, one host": (jax_gpus(2, 4), "gpu-p5.48xlarge-8"),
    "2 processes of 4, two hosts": (
        jax_gpus(2, 4, slice_per_process=True),
        "gpu-nvidia-h100-80gb-hbm3-8",
    ),
    "2 RTX 4090": (jax_gpus(1, 2, kind=RTX), "gpu-nvidia-geforce-rtx-4090-2"),
}


def rows_held(plan: MeshPlan, global_batch: int, process: int) -> set[int]:
    """The batch rows the process's devices hold, from the mesh positions alone."""
    batch = [i for i, a in enumerate(plan.axis_names) if a in plan.batch_axis_names]
    sizes = [plan.devices.shape[i] for i in batch]
    per = global_batch // math.prod(sizes)
    held = set()
    for pos, device in np.ndenumerate(plan.devices):
        if device.process_index == process:
            shard = int(np.ravel_multi_index([pos[i] for i in batch], sizes))
            held |= set(range(shard * per, (shard + 1) * per))
    return held


@pytest.mark.parametrize("name", SETS)
def test_detection_names_catalogue_hosts_and_describes_the_rest(name):
    devices, selector = SETS[name]
    assert detect_hardware(devices) == selector
    text = MeshConfig((-1,), ("data",)).plan(devices, selector=selector).describe()
    if selector.startswith("gpu-p5"):  # a catalogue host: its facts
        assert "catalogue  per GPU: hbm 80 GB" in text and "no entry" not in text
    else:
        assert "catalogue  no entry matches: " in text
        assert "so these facts are unknown: hbm, peak bf16, nvlink bw, network per gpu" in text


@pytest.mark.parametrize("preset", list_presets())
@pytest.mark.parametrize("name", SETS)
def test_every_preset_plans_and_feeds_each_host(name, preset):
    devices, selector = SETS[name]
    plan = MeshConfig.from_preset(preset).plan(devices)  # the selector is detected
    assert plan.hardware == selector and plan.granule_kind == "slice"
    assert sorted(d.id for d in plan.devices.flat) == [d.id for d in devices]
    assert all(q.dcn_ok for q in plan.quality().values())
    global_batch = 8 * plan.data_parallel_size
    rows: set[int] = set()
    for process in sorted({d.process_index for d in devices}):
        got = host_batch_slice(plan, global_batch, plan.batch_axis_names, process_index=process)
        assert set(range(got.start, got.stop)) == rows_held(plan, global_batch, process)
        rows |= set(range(got.start, got.stop))
    assert rows == set(range(global_batch))


@pytest.mark.parametrize("name", SETS)
def test_shard_batch_on_the_same_layout_of_real_devices(name):
    # the plan's grid, with each stand-in replaced by the real CPU device of the same id
    plan = MeshConfig.from_preset("fsdp_tp").plan(SETS[name][0])
    real = jax.devices()
    mesh = Mesh(np.vectorize(lambda d: real[d.id])(plan.devices), plan.axis_names)
    x = np.arange(4 * plan.data_parallel_size * 3, dtype=np.float32).reshape(-1, 3)
    out = shard_batch({"x": x}, mesh, plan.batch_axis_names)["x"]
    assert out.shape == x.shape
    for shard in out.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), x[shard.index])
    # split over the batch axes: as many distinct row ranges as the data-parallel degree
    ranges = {shard.index[0].indices(len(x))[:2] for shard in out.addressable_shards}
    assert len(ranges) == plan.data_parallel_size


def test_where_no_rule_matches_the_default_shape_applies():
    devices = SETS["4 GPUs"][0]
    for preset in ("dp_sp", "pipeline_fsdp_tp"):
        fields = get_preset(preset).config
        default = plan_mesh(
            fields.mesh_shape,
            devices,
            axis_names=fields.mesh_axis_names,
            batch_axis_names=fields.batch_axis_names,
        )
        assert MeshConfig.from_preset(preset).plan(devices).shape == default.shape
    # a catalogue host still gets its rule: tensor parallel over the host's 8 GPUs
    assert MeshConfig.from_preset("fsdp_tp").plan(SETS["8 GPUs, one host"][0]).shape["model"] == 8


def test_rules_can_name_a_workstation():
    config = MeshConfig(
        (-1, 1),
        ("data", "model"),
        mesh_rules=(("gpu-nvidia-h100-80gb-hbm3-4", (2, 2)), ("gpu-.*", (1, -1))),
    )
    assert config.plan(SETS["4 GPUs"][0]).shape == {"data": 2, "model": 2}
    assert config.plan(SETS["2 RTX 4090"][0]).shape == {"data": 1, "model": 2}
    explicit = config.plan(SETS["4 GPUs"][0], selector="my-box")  # no rule: the default
    assert explicit.hardware == "my-box" and explicit.shape == {"data": 4, "model": 1}


@pytest.mark.parametrize("selector", ["", 3, b"gpu-x"])
def test_a_selector_must_be_a_non_empty_string(selector):
    config = MeshConfig.from_preset("fsdp")
    with pytest.raises(MeshConfigError, match=f"selector={selector!r}; accepted: a non-empty"):
        config.plan(SETS["1 GPU"][0], selector=selector)
    with pytest.raises(MeshConfigError, match="selector="):
        config.select(selector)


# -- the CLI on these devices ------------------------------------------------------------------


@pytest.fixture
def local(monkeypatch):
    """Make `jax.devices()` of the CLI a stand-in set; its Mesh is built over the real CPU
    devices of the same ids (stand-ins cannot form a jax Mesh)."""

    def use(devices):
        import loadax_mesh.cli.main as cli

        real = jax.devices()
        monkeypatch.setattr(cli, "_jax_devices", lambda: list(devices))
        monkeypatch.setattr(
            MeshPlan,
            "to_jax_mesh",
            lambda plan, axis_types=None: Mesh(
                np.vectorize(lambda d: real[d.id])(plan.devices), plan.axis_names
            ),
        )

    return use


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    return out


@pytest.mark.parametrize("name", ["1 GPU", "2 RTX 4090", "8 GPUs, one host"])
def test_devices_command(capsys, local, name):
    devices, selector = SETS[name]
    local(devices)
    out = run(capsys, "devices")
    n = len(devices)
    assert out.startswith(f"hardware {selector}: {n} device{'s' * (n > 1)}, process 0 of 1\n")
    assert ("no entry matches" in out) == (not selector.startswith("gpu-p5"))
    header = out.split("\n\n")[1].splitlines()[0].split()
    assert header[-2:] == ["core_on_chip", "local_hardware_id"]
    first = out.split("\n\n")[1].splitlines()[1]
    assert first.startswith("0   gpu") and "[0, 0, 0]" in first  # coords as jax gives them
    data = json.loads(run(capsys, "devices", "--format", "json"))
    assert data["hardware"] == selector and len(data["devices"]) == n
    assert data["devices"][0]["coords"] == [0, 0, 0] and data["devices"][0]["core_on_chip"] is None


@pytest.mark.parametrize("name", SETS)
def test_plan_local_devices(capsys, local, name):
    devices, selector = SETS[name]
    local(devices)
    out = run(capsys, "plan", "--devices", "local", "--strategy", "fsdp")
    assert out.startswith(f"hardware   {selector}: ")
    assert "built jax.sharding.Mesh" in out
    data = json.loads(
        run(capsys, "plan", "--devices", "local", "--strategy", "fsdp_tp", "--format", "json")
    )
    summary = data["hardware_summary"]
    assert data["hardware"] == selector and summary["devices"] == len(devices)
    if selector.startswith("gpu-p5"):
        assert summary["catalogue_miss"] is None and summary["facts"]["hbm"] == "80 GB"
    else:
        assert summary["catalogue_miss"] and summary["facts"] == {}
        assert summary["unknown_facts"] == [
            "hbm",
            "peak_bf16",
            "nvlink_bandwidth",
            "network_per_gpu",
        ]
