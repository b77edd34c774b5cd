"""MeshConfig: rules, select, round trips, batch specs, and every kind of bad input."""

import json

import pytest
from jax.sharding import PartitionSpec as P

from loadax_mesh import (
    HybridMeshShape,
    MeshConfig,
    MeshConfigError,
    create_device_mesh,
    match_regex_rules,
    plan_mesh,
    simulate_devices,
)
from tests.standins import gpu_nodes

RULES = (
    ("tpu-v5litepod-256", (-1, 256)),
    ("tpu-v5litepod-256-4", HybridMeshShape((1, 256), (4, 1))),
    ("gpu-.*", None),
)


def test_rules_use_fullmatch_and_first_wins():
    assert match_regex_rules("tpu-v5litepod-256", RULES) == (-1, 256)
    assert match_regex_rules("tpu-v5litepod-256-4", RULES) == HybridMeshShape((1, 256), (4, 1))
    assert match_regex_rules("xtpu-v5litepod-256", RULES, default="none") == "none"
    first = (("tpu-.*", 1), ("tpu-v5p-.*", 2))
    assert match_regex_rules("tpu-v5p-512", first) == 1


def test_select_picks_the_rule_and_none_means_first_axis():
    config = MeshConfig((-1, 8), ("data", "model"), mesh_rules=RULES)
    assert config.select("tpu-v5litepod-256-4").mesh_shape == HybridMeshShape((1, 256), (4, 1))
    assert config.select("gpu-p5.48xlarge-16").mesh_shape == (-1, 1)
    assert config.select("cpu-8") is config


def test_none_shape_means_all_devices_on_the_first_axis():
    assert MeshConfig(None, ("data", "fsdp", "model")).mesh_shape == (-1, 1, 1)


def test_plan_with_rules_and_a_selector():
    config = MeshConfig((-1, 8), ("data", "model"), mesh_rules=(("gpu-.*-16", (2, 8)),))
    plan = config.plan(gpu_nodes(2), selector="gpu-p5.48xlarge-16")
    assert plan.shape == {"data": 2, "model": 8} and plan.hardware == "gpu-p5.48xlarge-16"


def test_a_simulated_set_names_its_hardware_and_picks_its_rule():
    devices = simulate_devices("gpu-a3-megagpu-8g-64")  # the same devices as p5 nodes
    config = MeshConfig((-1, 8), ("data", "model"), mesh_rules=(("gpu-a3-megagpu.*", (-1, 4)),))
    plan = config.plan(devices)
    assert plan.hardware == "gpu-a3-megagpu-8g-64" and plan.shape == {"data": 16, "model": 4}
    assert MeshConfig((-1,), ("data",)).plan(devices).hardware == "gpu-a3-megagpu-8g-64"


def test_lists_become_tuples_and_configs_are_hashable():
    config = MeshConfig([2, -1], ["data", "model"], ["data"], [["gpu-.*", [1, 8]]])
    assert config.mesh_shape == (2, -1) and config.mesh_axis_names == ("data", "model")
    assert config.batch_axis_names == ("data",) and config.mesh_rules == (("gpu-.*", (1, 8)),)
    assert hash(config) == hash(
        MeshConfig((2, -1), ("data", "model"), ("data",), (("gpu-.*", (1, 8)),))
    )


@pytest.mark.parametrize(
    "config",
    [
        MeshConfig((-1, 4), ("data", "model")),
        MeshConfig(
            HybridMeshShape((1, 8), (-1, 1)),
            ("data", "model"),
            ("data", "model"),
            mesh_rules=(*RULES[:2], ("cpu-.*", None)),
        ),
        MeshConfig(None, ("data",)),
    ],
)
def test_dict_round_trip_through_json(config):
    data = json.loads(json.dumps(config.to_dict()))
    assert MeshConfig.from_dict(data) == config


def test_from_toml(tmp_path):
    path = tmp_path / "mesh.toml"
    path.write_text(
        'mesh_shape = [-1, 8]\nmesh_axis_names = ["data", "model"]\n'
        '[[mesh_rules]]\nselector = "tpu-v5p-.*"\nmesh_shape = {ici_mesh_shape = [1, 64], '
        'dcn_mesh_shape = [-1, 1]}\n[[mesh_rules]]\nselector = "cpu-.*"\n'
    )
    config = MeshConfig.from_toml(path)
    assert config.mesh_rules == (
        ("tpu-v5p-.*", HybridMeshShape((1, 64), (-1, 1))),
        ("cpu-.*", None),
    )


@pytest.mark.parametrize(
    ("batch", "spec"),
    [
        ("data", P("data")),
        (("data",), P("data")),
        (("fsdp", "data"), P(("data", "fsdp"))),
    ],
)
def test_batch_partition_spec(batch, spec):
    config = MeshConfig((2, 2, 2), ("data", "fsdp", "model"), batch)
    assert config.batch_partition_spec() == spec


def test_hosts_and_host_id_on_one_process():
    config = MeshConfig((-1,), ("data",))
    assert (config.hosts, config.host_id) == (1, 0)


# -- bad input: every one a MeshConfigError naming field and value -----------------------
NAMES = ("data", "model")
BAD = [
    (lambda: MeshConfig((16.5, 4), NAMES), "mesh_shape.*16.5"),
    (lambda: MeshConfig(("16", "4"), NAMES), "mesh_shape.*'16'"),
    (lambda: MeshConfig((True, 4), NAMES), "mesh_shape.*True"),
    (lambda: MeshConfig((0, 4), NAMES), "mesh_shape.*holds 0"),
    (lambda: MeshConfig((-2, 4), NAMES), "mesh_shape.*holds -2"),
    (lambda: MeshConfig((-1, -1), NAMES), "more than one -1"),
    (lambda: MeshConfig((), ()), "mesh_shape|mesh_axis_names"),
    (lambda: MeshConfig(8, ("data",)), "mesh_shape=8"),
    (lambda: MeshConfig((2, 4), ("data",)), "has 2 axes; accepted: 1"),
    (lambda: MeshConfig((2, 4), ("data", "data")), "repeats a name"),
    (lambda: MeshConfig((2, 4), ("data", "")), "non-empty"),
    (lambda: MeshConfig((2, 4), ("data", 3)), "holds 3"),
    (lambda: MeshConfig((2, 4), "data"), "mesh_axis_names='data'"),
    (
        lambda: MeshConfig((2, 4), ("batch", "model")),
        r"batch_axis_names='data' \(the default\).*not mesh axes",
    ),
    (lambda: MeshConfig((2, 4), NAMES, ("data", "data")), "batch_axis_names.*repeats"),
    (lambda: MeshConfig((2, 4), NAMES, ()), "batch_axis_names"),
    (lambda: MeshConfig((2, 4), NAMES, mesh_rules=(("tpu-(", (2, 4)),)), "not a valid regex"),
    (lambda: MeshConfig((2, 4), NAMES, mesh_rules=((3, (2, 4)),)), r"mesh_rules\[0\]\[0\]=3"),
    (
        lambda: MeshConfig((2, 4), NAMES, mesh_rules=(("cpu-8", (2, 4)), ("tpu-.*", (2, 2, 2)))),
        r"^mesh rule 'tpu-\.\*' \(mesh_rules\[1\]\): shape=\(2, 2, 2\) has 3 axes; accepted: 2",
    ),
    (
        lambda: MeshConfig((2, 4), NAMES, mesh_rules=(("gpu-.*", (16.5, 4)),)),
        r"^mesh rule 'gpu-\.\*' \(mesh_rules\[0\]\): shape=\(16\.5, 4\) holds 16\.5 \(float\)",
    ),
    (
        lambda: MeshConfig(
            (2, 4), NAMES, mesh_rules=(("gpu-.*", HybridMeshShape((1, 1, 8), (1, -1, 1))),)
        ),
        r"^mesh rule 'gpu-\.\*' \(mesh_rules\[0\]\): shape=HybridMeshShape\(.*has 3 axes",
    ),
    (
        lambda: MeshConfig.from_dict(
            {
                "mesh_axis_names": ["data"],
                "mesh_rules": [{"selector": "tpu-v4-.*", "mesh_shape": {"ici_mesh_shape": [8]}}],
            }
        ),
        r"^mesh rule 'tpu-v4-\.\*' \(mesh_rules\[0\]\): shape=.* needs ici_mesh_shape and dcn",
    ),
    (
        lambda: MeshConfig.from_dict(
            {
                "mesh_axis_names": ["data"],
                "mesh_rules": [["gpu-.*", {"ici_mesh_shape": [8], "dcn_mesh_shape": [1, 1]}]],
            }
        ),
        r"^mesh rule 'gpu-\.\*' \(mesh_rules\[0\]\): ici_mesh_shape=\(8,\) has 1 axes but dcn",
    ),
    (
        lambda: MeshConfig((-1, 1), NAMES, mesh_rules=(("gpu-.*", (-1, 16)),)).plan(
            gpu_nodes(1), selector="gpu-p5.48xlarge-8"
        ),
        r"^mesh rule 'gpu-\.\*' \(mesh_rules\[0\]\) matched 'gpu-p5\.48xlarge-8': mesh_shape="
        r"\(-1, 16\): the other axes take 16 devices, which does not divide 8",
    ),
    (lambda: MeshConfig((2, 4), NAMES, mesh_rules=(("a",),)), r"mesh_rules\[0\]="),
    (lambda: MeshConfig((2, 4), NAMES, mesh_rules="a"), "mesh_rules='a'"),
    (lambda: HybridMeshShape((1, 8), (2,)), "same length"),
    (lambda: HybridMeshShape((1, 8.0), (2, 1)), "ici_mesh_shape"),
    (lambda: HybridMeshShape((1, 8), (-1, -1)), "dcn_mesh_shape.*more than one -1"),
    (lambda: MeshConfig(HybridMeshShape((1, 8), (2, 1)), ("data",)), "has 2 axes"),
    (
        lambda: MeshConfig.from_dict({"mesh_shape": [2], "mesh_axis_names": ["data"], "x": 1}),
        "unknown keys \\['x'\\]",
    ),
    (lambda: MeshConfig.from_dict({"mesh_shape": [2]}), "mesh_axis_names"),
    (
        lambda: MeshConfig.from_dict(
            {"mesh_shape": {"ici_mesh_shape": [2]}, "mesh_axis_names": ["data"]}
        ),
        "dcn_mesh_shape",
    ),
    (lambda: MeshConfig.from_toml("/nonexistent/mesh.toml"), "no readable TOML"),
    (lambda: MeshConfig((2, 4), NAMES).plan([]), "devices=\\[\\] is empty"),
    (lambda: MeshConfig((2, 2), NAMES).plan(gpu_nodes(1)), "uses 4 devices but 8"),
    (lambda: MeshConfig((2, 4), NAMES).plan(gpu_nodes(1), granule="rack"), "granule='rack'"),
    (lambda: MeshConfig((2, 4), NAMES).plan(gpu_nodes(1) * 2), "more than once"),
    (lambda: MeshConfig((2, 4), NAMES).plan([object()] * 8), "devices:"),
    (lambda: MeshConfig((-1,), ("data",)).plan(gpu_nodes(1), selector=3), "selector=3"),
    (
        lambda: MeshConfig((2, 4), NAMES, mesh_rules=(("x", None),)).plan(gpu_nodes(1), selector=4),
        "selector=4",
    ),
    (lambda: MeshConfig((2, 4), NAMES).create_device_mesh(axis_types=("explicit",)), "axis_types"),
    (lambda: match_regex_rules("tpu-v4-8", [("tpu-(", 1)]), r"rules\[0\]\[0\]='tpu-\('"),
    (lambda: create_device_mesh((), gpu_nodes(1)), r"mesh_shape=\(\) is not"),
    (
        lambda: plan_mesh((-1,), simulate_devices("cpu-8"), axis_names="data"),
        "mesh_axis_names='data'",
    ),
    (
        lambda: plan_mesh((-1,), simulate_devices("cpu-8"), axis_names=("data",)).to_jax_mesh(),
        r"simulated devices \(cpu-8\)",
    ),
]


@pytest.mark.parametrize(("make", "message"), BAD)
def test_bad_input_is_a_mesh_config_error(make, message):
    with pytest.raises(MeshConfigError, match=message) as info:
        make()
    assert isinstance(info.value, ValueError)
