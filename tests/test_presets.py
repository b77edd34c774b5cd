"""Strategy presets: files, rules over the whole catalogue, overrides and their errors."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

import loadax_mesh as lm
from loadax_mesh import HybridMeshShape, MeshConfig, MeshConfigError, ModelSpec
from loadax_mesh.hardware.strings import list_hardware, parse_hardware, simulate_devices
from loadax_mesh.presets import get_preset, list_presets, load_preset
from loadax_mesh.rules import match_regex_rules
from tests.helpers import run_python

PRESETS = ["dp", "dp_sp", "fsdp", "fsdp_ep", "fsdp_tp", "hsdp", "pipeline_fsdp_tp"]
NO_MATCH = object()


def catalogue_strings(limit=1024):
    """Every catalogue example of at most `limit` devices, plus a two-slice TPU set per gen."""
    out = []
    for t in list_hardware():
        small = [e for e in t.examples if parse_hardware(e).num_devices <= limit]
        out += small
        if t.platform == "tpu" and t.multislice is not False:
            out.append(small[-1] + "-2")
    return [*out, "cpu-1", "cpu-3", "cpu-2x3", "cpu-4x1"]


STRINGS = catalogue_strings()
DEVICES = {}


def devices_for(hardware):
    if hardware not in DEVICES:
        DEVICES[hardware] = simulate_devices(hardware)
    return DEVICES[hardware]


def totals(shape, n):
    """Per axis, the total size (-1 where open) of a rule value."""
    if shape is None:
        return (-1,) + (1,) * (n - 1)
    if isinstance(shape, HybridMeshShape):
        pairs = zip(shape.ici_mesh_shape, shape.dcn_mesh_shape, strict=True)
        return tuple(-1 if -1 in p else p[0] * p[1] for p in pairs)
    return tuple(shape)


def processes_along(plan, axis):
    """For every line of devices along `axis`, how many processes it touches (max)."""
    procs = np.vectorize(lambda d: d.process_index)(plan.devices)
    lines = np.moveaxis(procs, plan.axis_names.index(axis), -1).reshape(-1, plan.shape[axis])
    return max(len(set(line.tolist())) for line in lines)


# -- the files ---------------------------------------------------------------------------------


def test_list_presets():
    assert list_presets() == PRESETS
    assert lm.list_presets() == PRESETS


@pytest.mark.parametrize(
    ("name", "axes", "batch"),
    [
        ("dp", ("data",), ("data",)),
        ("fsdp", ("data", "fsdp"), ("data", "fsdp")),
        ("hsdp", ("replicate", "shard"), ("replicate", "shard")),
        ("fsdp_tp", ("data", "fsdp", "model"), ("data", "fsdp")),
        ("fsdp_ep", ("data", "fsdp", "expert"), ("data", "fsdp", "expert")),
        ("dp_sp", ("data_parallel", "sequence_parallel"), ("data_parallel",)),
        ("pipeline_fsdp_tp", ("pipeline", "data", "fsdp", "model"), ("data", "fsdp")),
    ],
)
def test_preset_axes(name, axes, batch):
    config = MeshConfig.from_preset(name)
    assert config.mesh_axis_names == axes and config.batch_axis_names == batch
    assert -1 in totals(config.mesh_shape, len(axes))
    assert config.mesh_rules
    assert MeshConfig.from_dict(config.to_dict()) == config
    assert get_preset(name).description


@pytest.mark.parametrize("name", PRESETS)
def test_rules_cover_the_catalogue(name):
    config = MeshConfig.from_preset(name)
    for hardware in STRINGS:
        assert match_regex_rules(hardware, config.mesh_rules, default=NO_MATCH) is not NO_MATCH


# -- every preset plans on every catalogue entry -----------------------------------------------


@pytest.mark.parametrize("name", PRESETS)
def test_preset_plans_everywhere(name):
    config = MeshConfig.from_preset(name)
    for hardware in STRINGS:
        devices = devices_for(hardware)
        plan = config.plan(devices, selector=hardware)
        assert plan.hardware == hardware
        assert math.prod(plan.shape.values()) == len(devices)
        quality = plan.quality()
        assert all(q.dcn_ok for q in quality.values()), (hardware, quality)
        # detection picks the same rule for simulated devices
        detected = config.plan(devices)
        assert detected.shape == plan.shape, hardware


def test_fsdp_inside_granules_data_across():
    config = MeshConfig.from_preset("fsdp")

    def plan(hardware):
        return config.plan(simulate_devices(hardware), selector=hardware)

    p = plan("tpu-v5litepod-16-2")
    assert (p.ici_mesh_shape, p.dcn_mesh_shape) == ((1, 16), (2, 1))
    p = plan("gpu-p5.48xlarge-32")
    assert (p.ici_mesh_shape, p.dcn_mesh_shape) == ((1, 8), (4, 1))
    # An NVL72 rack shards 8 ways (72 divides no model's d_model) and runs data over the rest.
    p = plan("gpu-a4x-highgpu-4g-144")
    assert (p.ici_mesh_shape, p.dcn_mesh_shape) == ((9, 8), (2, 1))
    assert plan("gpu-a4x-highgpu-4g-72").shape == {"data": 9, "fsdp": 8}
    assert plan("gpu-a4x-highgpu-4g-12").shape == {"data": 3, "fsdp": 4}
    assert plan("gpu-a4x-highgpu-4g-64").shape == {"data": 8, "fsdp": 8}


# The axes over which the reference step shards a weight's d_model or its heads.
_SHARDING_AXES = ("fsdp", "shard", "model")


@pytest.mark.parametrize("name", ["fsdp", "hsdp", "fsdp_tp", "pipeline_fsdp_tp"])
def test_a_preset_default_on_catalogue_hardware_shards_every_catalogue_model(name):
    """Every catalogue model the reference step builds (it refuses MoE and latent-attention
    models) whose d_model divides by 4096, the largest FSDP degree a preset gives on catalogue
    hardware (v4-8192); MaxText's 2023 models (d_model 5120 to 20480: 1024 or 2048 times an odd
    number) shard over the slices their tables ran on, not over every pod."""
    from loadax_mesh.workload.layout import check_modelled
    from loadax_mesh.workload.spec import list_models

    models = []
    for m in (ModelSpec.from_name(n) for n in list_models() if n != "tiny"):
        try:
            check_modelled(m)
        except MeshConfigError:
            continue
        if m.d_model % 4096 == 0:
            models.append(m)
    assert {m.name for m in models} >= {"llama2-7b", "llama3-8b", "llama3-70b", "llama3-405b"}
    config = MeshConfig.from_preset(name)
    bad = []
    for t in list_hardware():
        for hardware in t.examples:
            plan = config.plan(simulate_devices(hardware), selector=hardware)
            for axis in _SHARDING_AXES:
                size = plan.shape.get(axis, 1)
                bad += [(hardware, axis, size, m.name) for m in models if m.d_model % size]
                if axis == "model":
                    bad += [(hardware, axis, size, m.name) for m in models if m.num_kv_heads % size]
    assert not bad, bad


def test_hsdp_shard_inside_replicate_across():
    config = MeshConfig.from_preset("hsdp")
    plan = config.plan(simulate_devices("gpu-p5.48xlarge-64"), selector="gpu-p5.48xlarge-64")
    assert plan.shape == {"replicate": 8, "shard": 8}
    assert processes_along(plan, "shard") == 1
    plan = config.plan(simulate_devices("cpu-2x4"), selector="cpu-2x4")
    assert plan.shape == {"replicate": 2, "shard": 4}


@pytest.mark.parametrize(
    ("name", "axis", "hardware", "size"),
    [
        ("fsdp_tp", "model", "gpu-p5.48xlarge-64", 8),
        ("fsdp_tp", "model", "gpu-a4x-highgpu-4g-144", 4),
        ("fsdp_tp", "model", "gpu-a4x-highgpu-4g-72", 4),
        ("pipeline_fsdp_tp", "model", "gpu-a3-ultragpu-8g-32", 8),
        ("dp_sp", "sequence_parallel", "gpu-a4-highgpu-8g-16", 8),
        ("dp_sp", "sequence_parallel", "gpu-p6e-gb200.36xlarge-144", 4),
        ("fsdp_tp", "model", "cpu-2x4", 2),
    ],
)
def test_model_parallel_axes_stay_inside_a_host(name, axis, hardware, size):
    plan = MeshConfig.from_preset(name).plan(simulate_devices(hardware), selector=hardware)
    assert plan.shape[axis] == size
    assert processes_along(plan, axis) == 1


@pytest.mark.parametrize("t", [t for t in list_hardware() if t.platform == "gpu"], ids=str)
def test_model_parallel_axes_fill_a_host_of_every_catalogue_gpu(t):
    # the presets name the catalogue's instance types; a new entry needs its rule
    hardware = f"gpu-{t.key}-{2 * t.nvlink_domain}"
    axes = {"fsdp_tp": "model", "pipeline_fsdp_tp": "model", "dp_sp": "sequence_parallel"}
    for name, axis in axes.items():
        plan = MeshConfig.from_preset(name).plan(simulate_devices(hardware))
        assert plan.shape[axis] == t.devices_per_host, (name, hardware)
        assert processes_along(plan, axis) == 1


def test_large_sets_plan():
    for hardware, name, shape in [
        ("tpu-v5p-12288-2", "fsdp", {"data": 6, "fsdp": 2048}),  # 6144 = 3 x 2048 a slice
        ("gpu-p5.48xlarge-4096", "fsdp_tp", {"data": 1, "fsdp": 512, "model": 8}),
    ]:
        plan = MeshConfig.from_preset(name).plan(simulate_devices(hardware), selector=hardware)
        assert plan.shape == shape


# -- overrides ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PRESETS)
def test_an_override_fixes_the_axis_everywhere(name):
    preset = get_preset(name)
    axes = preset.config.mesh_axis_names
    for keyword, axis in preset.keywords().items():
        i = axes.index(axis)
        for size in (1, 2, 8):
            config = load_preset(name, **{keyword: size})
            values = [config.mesh_shape, *(v for _, v in config.mesh_rules)]
            before = [preset.config.mesh_shape, *(v for _, v in preset.config.mesh_rules)]
            for old, new in zip(before, values, strict=True):
                old_t, new_t = totals(old, len(axes)), totals(new, len(axes))
                assert new_t[i] == size, (keyword, old, new)
                assert new_t.count(-1) <= 2
                changed = [j for j in range(len(axes)) if j != i and old_t[j] != new_t[j]]
                # at most the rest axis changes: it becomes -1 when the override closed the
                # only open axis
                assert all(new_t[j] == -1 for j in changed) and len(changed) <= 1
                if changed:
                    assert old_t[i] == -1 and axes[changed[0]] in preset.fill_order


@pytest.mark.parametrize(
    ("name", "overrides", "hardware", "shape"),
    [
        ("fsdp_tp", {"tp": 8}, "tpu-v5p-512-2", {"data": 2, "fsdp": 32, "model": 8}),
        ("fsdp_tp", {"tp": 8}, "gpu-a4x-highgpu-4g-144", {"data": 18, "fsdp": 1, "model": 8}),
        ("fsdp_tp", {"tp": 16}, "gpu-p5.48xlarge-32", {"data": 1, "fsdp": 2, "model": 16}),
        ("fsdp_tp", {"tp": 2, "dp": 2}, "cpu-8", {"data": 2, "fsdp": 2, "model": 2}),
        ("fsdp_tp", {"model": 1}, "gpu-p5.48xlarge-16", {"data": 1, "fsdp": 16, "model": 1}),
        ("fsdp", {"fsdp": 16}, "gpu-p5.48xlarge-32", {"data": 2, "fsdp": 16}),
        ("fsdp", {"dp": 2}, "gpu-p5.48xlarge-32", {"data": 2, "fsdp": 16}),
        ("fsdp", {"fsdp": 64}, "tpu-v5p-256-2", {"data": 4, "fsdp": 64}),
        ("hsdp", {"dp_shard": 4}, "cpu-2x4", {"replicate": 2, "shard": 4}),
        ("hsdp", {"shard": 16}, "gpu-p5.48xlarge-32", {"replicate": 2, "shard": 16}),
        ("hsdp", {"replicate": 2}, "gpu-p5.48xlarge-32", {"replicate": 2, "shard": 16}),
        ("dp_sp", {"sp": 4}, "gpu-p5.48xlarge-16", {"data_parallel": 4, "sequence_parallel": 4}),
        ("dp_sp", {"dp": 2}, "gpu-p5.48xlarge-32", {"data_parallel": 2, "sequence_parallel": 16}),
        ("dp", {"dp": 8}, "cpu-8", {"data": 8}),
        (
            "pipeline_fsdp_tp",
            {"pp": 2},
            "tpu-v5p-512-4",
            {"pipeline": 2, "data": 2, "fsdp": 64, "model": 4},
        ),
        (
            "pipeline_fsdp_tp",
            {"pp": 4, "tp": 4},
            "gpu-p5.48xlarge-64",
            {"pipeline": 4, "data": 1, "fsdp": 4, "model": 4},
        ),
        (
            "pipeline_fsdp_tp",
            {"pp": 2},
            "gpu-a4x-highgpu-4g-72",
            {"pipeline": 2, "data": 9, "fsdp": 1, "model": 4},
        ),
    ],
)
def test_overrides_plan(name, overrides, hardware, shape):
    config = MeshConfig.from_preset(name, **overrides)
    assert config.to_dict() == load_preset(name, **overrides).to_dict()
    plan = config.plan(simulate_devices(hardware), selector=hardware)
    assert plan.shape == shape
    assert all(q.dcn_ok for q in plan.quality().values())


def test_pipeline_stages_go_across_slices():
    plan = MeshConfig.from_preset("pipeline_fsdp_tp", pp=2).plan(
        simulate_devices("tpu-v5p-512-4"), selector="tpu-v5p-512-4"
    )
    assert plan.dcn_mesh_shape == (2, 2, 1, 1)


def test_override_without_effect_keeps_the_plan():
    hardware = "tpu-v5p-512-2"
    base = MeshConfig.from_preset("fsdp_tp").plan(simulate_devices(hardware), selector=hardware)
    same = MeshConfig.from_preset("fsdp_tp", tp=4).plan(
        simulate_devices(hardware), selector=hardware
    )
    assert same.shape == base.shape and same.dcn_mesh_shape == base.dcn_mesh_shape


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sp": 4}, "override sp=4 is unknown; accepted: dp or data, fsdp, tp or model"),
        ({"tp": 0}, r"tp=0; accepted: a positive int"),
        ({"tp": -1}, r"tp=-1; accepted: a positive int"),
        ({"tp": 2.5}, r"tp=2.5 \(float\); accepted"),
        ({"tp": "8"}, r"tp='8' \(str\); accepted"),
        ({"tp": True}, r"tp=True; accepted"),
        ({"tp": 8, "model": 8}, r"sizes axis 'model' a second time"),
    ],
)
def test_override_errors(overrides, message):
    with pytest.raises(MeshConfigError, match=message):
        MeshConfig.from_preset("fsdp_tp", **overrides)


def test_unknown_preset():
    with pytest.raises(MeshConfigError, match="'zero3' is not a preset; accepted: auto, dp, "):
        MeshConfig.from_preset("zero3")
    with pytest.raises(MeshConfigError, match="is not a preset"):
        load_preset(["fsdp"])  # type: ignore[arg-type]


def test_impossible_override_fails_when_planned():
    config = MeshConfig.from_preset("fsdp_tp", tp=8)
    with pytest.raises(MeshConfigError, match=r"mesh_shape=\(1, -1, 8\).*does not divide 4"):
        config.plan(simulate_devices("tpu-v6e-4"), selector="tpu-v6e-4")


# -- detection and real devices ----------------------------------------------------------------


def test_plan_detects_the_hardware():
    plan = MeshConfig.from_preset("fsdp_tp").plan(simulate_devices("gpu-p5.48xlarge-16"))
    assert plan.hardware == "gpu-p5.48xlarge-16"
    assert plan.shape == {"data": 1, "fsdp": 2, "model": 8}


def test_real_cpu_devices():
    mesh = MeshConfig.from_preset("fsdp_tp").create_device_mesh()
    assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "model": 2}
    assert set(mesh.devices.flat) == set(jax.devices())
    mesh = MeshConfig.from_preset("dp_sp", sp=4).create_device_mesh()
    assert dict(mesh.shape) == {"data_parallel": 2, "sequence_parallel": 4}


def test_preset_planning_does_not_import_jax():
    code = (
        "import sys, loadax_mesh as lm\n"
        "devices = lm.simulate_devices('tpu-v5p-512')\n"
        "plan = lm.MeshConfig.from_preset('fsdp_tp', tp=8).plan(devices)\n"
        "print('jax' in sys.modules, plan.hardware, plan.shape['model'])\n"
    )
    assert run_python(code).split() == ["False", "tpu-v5p-512", "8"]
