"""The hardware catalogue, simulated devices, detection and wraparound."""

from __future__ import annotations

import re
import tomllib

import jax
import numpy as np
import pytest
from jax.experimental import mesh_utils

import loadax_mesh as lm
from loadax_mesh import MeshConfigError
from loadax_mesh._configs import config_path
from loadax_mesh.hardware.detect import match_catalogue
from loadax_mesh.hardware.devices import SimulatedDevice, read_devices
from loadax_mesh.hardware.strings import (
    detect_hardware,
    list_hardware,
    parse_hardware,
    simulate_devices,
    wraparound,
)
from tests.helpers import run_python
from tests.standins import gpu_nodes, tpu_slices

FIELDS = ("id", "platform", "device_kind", "process_index", "slice_index", "coords", "core_on_chip")


def attrs(devices):
    return [tuple(getattr(d, f, None) for f in FIELDS) for d in devices]


def columns(devices):
    """Per attribute, a numpy array over the devices (coords as an (n, d) array)."""
    out = {f: np.asarray([getattr(d, f) for d in devices]) for f in FIELDS if f != "coords"}
    out["coords"] = np.asarray([d.coords for d in devices])
    return out


# -- catalogue facts ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hardware", "chips", "topology", "hosts", "slices", "per_chip", "kind"),
    [
        ("tpu-v5p-512", 256, (4, 8, 8), 64, 1, 1, "TPU v5"),
        ("tpu-v5litepod-256-4", 1024, (16, 16), 256, 4, 1, "TPU v5 lite"),
        ("tpu-v6e-256", 256, (16, 16), 64, 1, 1, "TPU v6 lite"),
        ("tpu-7x-128", 64, (4, 4, 4), 16, 1, 2, "TPU7x"),
        ("tpu-v4-128", 64, (4, 4, 4), 16, 1, 1, "TPU v4"),
        ("tpu-v5p-8", 4, (2, 2, 1), 1, 1, 1, "TPU v5"),
        ("tpu-v5litepod-8", 8, (2, 4), 1, 1, 1, "TPU v5 lite"),
        ("tpu-v3-32", 16, (4, 4), 4, 1, 2, "TPU v3"),
    ],
)
def test_tpu_strings(hardware, chips, topology, hosts, slices, per_chip, kind):
    spec = parse_hardware(hardware)
    assert (spec.chips, spec.topology, spec.hosts, spec.slices) == (chips, topology, hosts, slices)
    assert spec.devices_per_chip == per_chip and spec.device_kind == kind
    devices = simulate_devices(hardware)
    col = columns(devices)
    assert len(devices) == spec.num_devices == chips * per_chip
    assert len(np.unique(col["process_index"])) == hosts
    if slices == 1:  # one slice: no slice_index, as on libtpu's devices
        assert set(col["slice_index"].tolist()) == {None}
    else:
        assert len(np.unique(col["slice_index"])) == slices
    assert set(col["core_on_chip"].tolist()) == set(range(per_chip))
    assert set(col["device_kind"].tolist()) == {kind} and set(col["platform"]) == {"tpu"}
    assert col["coords"].shape == (len(devices), 3)
    extent = tuple((col["coords"].max(axis=0) + 1).tolist())
    assert extent == (*topology, 1)[:3]
    # every host holds the same number of devices, and one slice's chips each
    per_host = np.unique(col["process_index"], return_counts=True)[1]
    assert (per_host == len(devices) // hosts).all()
    for p in np.unique(col["process_index"]):
        assert len(set(col["slice_index"][col["process_index"] == p].tolist())) == 1


def test_v5p_count_is_tensorcores_and_v5e_count_is_chips():
    assert parse_hardware("tpu-v5p-32").chips == 16
    assert parse_hardware("tpu-v5litepod-16").chips == 16
    assert parse_hardware("tpu-7x-8").num_devices == 8
    assert parse_hardware("tpu-7x-8").chips == 4


@pytest.mark.parametrize(
    ("hardware", "gpus", "hosts", "per_host", "domains", "kind"),
    [
        ("gpu-p5.48xlarge-256", 256, 32, 8, 32, "NVIDIA H100 80GB HBM3"),
        ("gpu-a3-megagpu-8g-64", 64, 8, 8, 8, "NVIDIA H100 80GB HBM3"),
        ("gpu-p4d.24xlarge-16", 16, 2, 8, 2, "NVIDIA A100-SXM4-40GB"),
        ("gpu-a4-highgpu-8g-8", 8, 1, 8, 1, "NVIDIA B200"),
        ("gpu-a4x-highgpu-4g-144", 144, 36, 4, 2, "NVIDIA GB200"),
        ("gpu-a4x-highgpu-4g-12", 12, 3, 4, 1, "NVIDIA GB200"),
        ("gpu-p6e-gb200.36xlarge-216", 216, 54, 4, 3, "NVIDIA GB200"),
    ],
)
def test_gpu_strings(hardware, gpus, hosts, per_host, domains, kind):
    spec = parse_hardware(hardware)
    assert (spec.num_devices, spec.hosts, spec.devices_per_host, spec.slices) == (
        gpus,
        hosts,
        per_host,
        domains,
    )
    devices = simulate_devices(hardware)
    col = columns(devices)
    assert col["platform"].tolist() == ["gpu"] * gpus and set(col["device_kind"]) == {kind}
    # ids grouped by host; coords = (domain, host in domain, local GPU) as jax's carry them
    assert col["id"].tolist() == list(range(gpus))
    assert (np.diff(col["process_index"]) >= 0).all()
    domain, host, local = col["coords"].T
    assert local.tolist() == [i % per_host for i in range(gpus)]
    assert (domain == col["slice_index"]).all()
    assert (domain * (hosts // domains) + host == col["process_index"]).all()
    assert len(np.unique(col["slice_index"])) == domains
    for s in np.unique(col["slice_index"]):
        procs = np.unique(col["process_index"][col["slice_index"] == s])
        assert len(procs) == hosts // domains  # an NVLink domain is whole hosts


def test_nvl72_rack_is_18_hosts_of_4():
    devices = simulate_devices("gpu-a4x-highgpu-4g-144")
    racks = {}
    for d in devices:
        racks.setdefault(d.slice_index, set()).add(d.process_index)
    assert sorted(len(h) for h in racks.values()) == [18, 18]
    assert racks[0].isdisjoint(racks[1])


@pytest.mark.parametrize(
    ("hardware", "granules"),
    [
        ("gpu-a4x-highgpu-4g-72", 1),  # one NVL72 rack: 18 hosts, one slice_index
        ("gpu-a4x-highgpu-4g-144", 2),
        ("gpu-p5.48xlarge-32", 4),
        ("tpu-v5p-512", 1),
        ("tpu-v5litepod-256-4", 4),
        ("cpu-2x4", 2),
    ],
)
def test_granules_as_auto_forms_them(hardware, granules):
    assert parse_hardware(hardware).granules == granules
    plan = lm.plan_mesh((-1,), simulate_devices(hardware), axis_names=("data",))
    assert plan.num_granules == granules


def test_cpu_strings():
    one = simulate_devices("cpu-8")
    assert [d.process_index for d in one] == [0] * 8 and [d.id for d in one] == list(range(8))
    assert all(d.slice_index is None and d.coords is None for d in one)
    two = simulate_devices("cpu-2x4")
    assert [d.process_index for d in two] == [0] * 4 + [1] * 4
    spec = parse_hardware("cpu-2x4")
    assert (spec.hosts, spec.devices_per_host, spec.granules) == (2, 4, 2)


def test_every_fact_names_known_sources():
    with open(config_path("hardware.toml"), "rb") as f:
        raw = tomllib.load(f)
    sources = set(raw["sources"])
    entries = [*raw["tpu"].values(), *raw["gpu"].values(), raw["cpu"]]
    count = 0
    for entry in entries:
        for key, fact in entry.items():
            if key in ("title", "cloud"):
                continue
            for item in fact if key == "topologies" else [fact]:
                assert item["source"] and set(item["source"]) <= sources, (key, item)
                count += 1
    assert count > 200
    for t in list_hardware():
        if t.platform == "tpu":
            for name in ("device_kind", "cores_per_chip", "devices_per_chip", "chips_per_host"):
                assert t.fact(name) is not None, (t.key, name)
            assert t.topologies
        if t.platform == "gpu":
            for name in ("gpus_per_host", "nvlink_domain", "hbm", "nvlink_bandwidth"):
                assert t.fact(name) is not None, (t.key, name)


def test_required_catalogue_entries():
    keys = {t.key for t in list_hardware()}
    assert {"v4", "v5litepod", "v5p", "v6e", "7x", "cpu"} <= keys
    assert {
        "p4d.24xlarge",
        "p4de.24xlarge",
        "p5.48xlarge",
        "p5e.48xlarge",
        "p5en.48xlarge",
        "p6-b200.48xlarge",
        "a3-highgpu-8g",
        "a3-megagpu-8g",
        "a3-ultragpu-8g",
        "a4-highgpu-8g",
        "a4x-highgpu-4g",
        "p6e-gb200.36xlarge",
    } <= keys
    v5p = next(t for t in list_hardware() if t.key == "v5p")
    published = {"2x2x1", "2x2x2", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16"}
    assert published <= {t.name for t in v5p.topologies}
    assert v5p.fact("dcn_bandwidth").value == 50
    assert v5p.fact("device_kind").source == ("MT", "AX")
    h200 = next(t for t in list_hardware() if t.key == "p5e.48xlarge").fact("device_kind")
    assert h200.status == "confirmed" and h200.source[0] == "G-h200"  # seen on a real H200


def test_facts_without_a_source_are_rejected():
    from loadax_mesh.hardware.catalogue import _fact

    with pytest.raises(MeshConfigError, match="source"):
        _fact({"value": 4}, name="dims", where="x", sources={"A": "a"})
    with pytest.raises(MeshConfigError, match="not in"):
        _fact({"value": 4, "source": ["B"]}, name="dims", where="x", sources={"A": "a"})
    with pytest.raises(MeshConfigError, match="a value unless"):
        _fact({"source": ["A"]}, name="dims", where="x", sources={"A": "a"})


# -- listing order and ids as JAX gives them ------------------------------------------------


@pytest.mark.parametrize("hardware", ["tpu-v4-128", "tpu-7x-64-2", "tpu-v5litepod-64-2"])
def test_tpu_listing_is_host_by_host_with_row_major_ids(hardware):
    spec = parse_hardware(hardware)
    col = columns(simulate_devices(hardware))
    assert (np.diff(col["process_index"]) >= 0).all()
    x, y, z = col["coords"].T
    dims = (*spec.topology, 1)[:3]
    slice_of = np.array([s or 0 for s in col["slice_index"].tolist()])  # None: one slice
    expected = col["core_on_chip"] + spec.devices_per_chip * (
        x + dims[0] * (y + dims[1] * (z + dims[2] * slice_of))
    )
    assert (col["id"] == expected).all()
    assert sorted(col["id"].tolist()) == list(range(len(expected)))


@pytest.mark.parametrize(
    ("hardware", "mesh_shape"),
    [("tpu-v4-128", (4, 16)), ("tpu-v5p-256", (8, 16)), ("tpu-7x-128", (8, 16))],
)
def test_jax_accepts_the_stand_ins(hardware, mesh_shape):
    """JAX's own TPU mesh builder reads coords and core_on_chip of our stand-ins."""
    devices = simulate_devices(hardware)
    mesh = mesh_utils.create_device_mesh(mesh_shape, devices, allow_split_physical_axes=True)
    assert mesh.shape == mesh_shape
    assert sorted(d.id for d in mesh.flat) == sorted(d.id for d in devices)


def test_jax_hybrid_mesh_reads_slice_index():
    devices = simulate_devices("tpu-v5litepod-16-2")
    mesh = mesh_utils.create_hybrid_device_mesh((4, 4), (2, 1), devices)
    assert {d.slice_index for d in mesh[:4].flat} == {0}
    assert {d.slice_index for d in mesh[4:].flat} == {1}


# -- wraparound -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "shape", "wrap"),
    [
        ("TPU v5", (4, 4, 4), (True, True, True)),
        ("TPU v5p", (4, 8, 8), (True, True, True)),
        ("TPU v5", (2, 4, 4), (False, False, False)),
        ("TPU v4", (8, 8, 12), (True, True, True)),
        ("TPU v4", (2, 2, 4), (False, False, False)),
        ("TPU7x", (4, 4, 8), (True, True, True)),
        ("TPU7x", (2, 2, 1), (False, False, False)),
        ("TPU v5 lite", (16, 16, 1), (True, True, False)),
        ("TPU v5 lite", (8, 16, 1), (False, True, False)),
        ("TPU v5 lite", (8, 8, 1), (False, False, False)),
        ("TPU v6 lite", (16, 16, 1), (True, True, False)),
        ("TPU v6e", (4, 16), (False, True)),
        ("TPU v9", (16, 16, 16), (False, False, False)),
        ("TPU v3", (32, 32, 1), (False, False, False)),
    ],
)
def test_wraparound(kind, shape, wrap):
    assert wraparound(kind, shape) == wrap


def test_planner_uses_catalogue_wraparound():
    plan = lm.plan_mesh((8, 8), simulate_devices("tpu-v6e-64"), axis_names=("data", "model"))
    assert plan.layout.torus.wrap == (False, False, False)
    plan = lm.plan_mesh((16, 16), simulate_devices("tpu-v6e-256"), axis_names=("data", "model"))
    assert plan.layout.torus.wrap == (True, True, False)
    assert parse_hardware("tpu-v5p-128").wrap == (True, True, True)


# -- detection -----------------------------------------------------------------------------


def sweep_strings():
    out = []
    for t in list_hardware():
        small = [e for e in t.examples if parse_hardware(e).num_devices <= 2048]
        out += small
        if t.platform == "tpu" and t.multislice is not False:
            out.append(small[-1] + "-2")
    return out


def first_type_of_kind(kind):
    return next(t for t in list_hardware() if kind in t.device_kinds)


@pytest.mark.parametrize("hardware", sweep_strings())
def test_detect_round_trip(hardware):
    devices = simulate_devices(hardware)
    assert detect_hardware(devices) == hardware  # a simulated set carries its string
    detected = detect_hardware(list(devices))  # from the devices' attributes alone
    assert attrs(simulate_devices(detected)) == attrs(devices)
    spec = parse_hardware(hardware)
    if first_type_of_kind(spec.device_kind) is spec.type:
        assert detected == hardware
    else:  # instance types that share a device kind cannot be told apart
        assert detected == f"gpu-{first_type_of_kind(spec.device_kind).key}-{spec.num_devices}"


def test_detect_real_cpu_devices():
    devices = jax.devices()
    assert len(devices) == 8
    assert detect_hardware(devices) == "cpu-8"
    assert detect_hardware() == "cpu-8"
    real = [(d.id, d.platform, d.device_kind, d.process_index) for d in devices]
    sim = [(d.id, d.platform, d.device_kind, d.process_index) for d in simulate_devices("cpu-8")]
    assert real == sim


def test_detect_cpu_processes_and_stand_ins():
    assert detect_hardware(simulate_devices("cpu-4x2")) == "cpu-4x2"
    assert detect_hardware(tpu_slices((4, 4, 1), num_slices=2)) == "tpu-v4-32-2"
    assert detect_hardware(gpu_nodes(2)) == "gpu-p5.48xlarge-16"
    # NVLink racks reported one slice per host (older XLA) still name the instance type
    racks = gpu_nodes(18, 4, kind="NVIDIA GB200")
    assert detect_hardware(racks) == "gpu-a4x-highgpu-4g-72"


def test_detect_counts_chips_not_devices_for_tensorcore_generations():
    split = tpu_slices((2, 2, 2), kind="TPU v5", cores_per_chip=2)
    assert detect_hardware(split) == "tpu-v5p-16"


@pytest.mark.parametrize(
    ("devices", "selector", "why"),
    [
        (tpu_slices((2, 2, 1), kind="TPU v9"), "tpu-tpu-v9-4", "TPU device_kind 'TPU v9' is not"),
        (gpu_nodes(1, kind="NVIDIA RTX 9090"), "gpu-nvidia-rtx-9090-8", "'NVIDIA RTX 9090' is not"),
        (gpu_nodes(1, 4), "gpu-nvidia-h100-80gb-hbm3-4", r"4 GPUs \(1 process, 1 slice_index"),
        (gpu_nodes(4, 4), "gpu-nvidia-h100-80gb-hbm3-16", r"not whole hosts of 8 GPUs \(p5"),
        (gpu_nodes(1, 8, kind="NVIDIA GB200"), "gpu-nvidia-gb200-8", "in NVLink domains of 72"),
        (
            [SimulatedDevice(i, "cpu", "cpu", 0 if i < 3 else 1) for i in range(4)],
            "cpu-cpu-4",
            r"different device counts \[1, 3\]",
        ),
        ([SimulatedDevice(0, "METAL", "Apple M3 Max", 0)], "METAL-apple-m3-max-1", "'METAL'"),
    ],
)
def test_devices_the_catalogue_lacks_get_a_generic_selector(devices, selector, why):
    assert detect_hardware(devices) == selector
    name, miss = match_catalogue(read_devices(devices))
    assert name is None and re.search(why, miss)


def test_catalogue_hosts_are_still_named():
    table = read_devices(gpu_nodes(2))
    assert match_catalogue(table) == ("gpu-p5.48xlarge-16", "")
    one_host = gpu_nodes(2, 4, nodes_per_domain=2)  # two processes of 4 GPUs, one slice_index
    assert detect_hardware(one_host) == "gpu-p5.48xlarge-8"


# -- parse errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hardware", "message"),
    [
        ("tpu-v9-8", r"unknown TPU generation 'v9'; accepted: .*v5litepod, v5p, v6e, 7x"),
        ("tpu-v5e-256", r"write 'v5litepod'"),
        ("tpu-tpu7x-128", r"write '7x'"),
        ("tpu-v5p-500", r"500 tensorcores .* accepted counts .*512 \(4x8x8\)"),
        ("tpu-v5litepod-512", r"accepted counts \(chips\): 1 \(1x1\).*256 \(16x16\)"),
        ("tpu-v5p-512-1", r"accepted: 'tpu-v5p-512' or a suffix >= 2"),
        ("tpu-v5p-512-0", r"slices='0'; accepted: a positive integer"),
        ("tpu-v3-32-2", r"no multislice"),
        ("tpu-v5p-0512", r"leading zeros"),
        ("gpu-p5.48xlarge-12", r"not whole hosts of 8 .* accepted: a multiple of 8"),
        ("gpu-a4x-highgpu-4g-100", r"accepted: 4, 8, \.\.\., 72 .* or a multiple of 72"),
        ("gpu-a4x-highgpu-4g-6", r"not whole hosts of 4"),
        ("gpu-h100-8", r"unknown GPU instance type 'h100'; accepted: p4d.24xlarge"),
        ("cpu-1x8", r"one process is written 'cpu-8'"),
        ("cpu-0", r"positive integer"),
        ("TPU-v5p-512", r"is not a hardware string; accepted: tpu-"),
        ("tpu-v5p", r"is not a hardware string"),
        ("", r"is not a hardware string"),
    ],
)
def test_parse_errors(hardware, message):
    with pytest.raises(MeshConfigError, match=message):
        simulate_devices(hardware)


def test_non_string_is_an_error():
    with pytest.raises(MeshConfigError, match="not a string"):
        parse_hardware(512)  # type: ignore[arg-type]


# -- scale and imports ------------------------------------------------------------------------


@pytest.mark.slow
def test_large_multislice_set():
    hardware = "tpu-v5litepod-256-512"  # 131,072 devices
    devices = simulate_devices(hardware)
    col = columns(devices)
    assert len(devices) == 131072 and len(np.unique(col["id"])) == 131072
    assert len(np.unique(col["process_index"])) == 512 * 64
    assert detect_hardware(devices) == hardware


def test_simulation_does_not_import_jax():
    code = (
        "import sys, loadax_mesh as lm\n"
        "devices = lm.simulate_devices('tpu-v5p-512')\n"
        "assert lm.detect_hardware(devices) == 'tpu-v5p-512'\n"
        "lm.plan_mesh((1, -1), devices, axis_names=('data', 'fsdp'))\n"
        "print('jax' in sys.modules, len(devices))\n"
    )
    assert run_python(code).split() == ["False", "256"]
