"""The planner on AXLearn's mesh cases, GPU nodes, NVLink domains and real CPU devices."""

import jax
import numpy as np
import pytest
from jax.experimental import mesh_utils

import loadax_mesh as lm
from loadax_mesh import HybridMeshShape, MeshConfig, MeshConfigError
from tests.helpers import assert_dcn_blocks_are_granules, ids
from tests.standins import cpu_processes, gpu_nodes, tpu_slices


def plan(shape, devices, **kw):
    names = tuple(f"a{i}" for i in range(len(shape)))
    return lm.plan_mesh(shape, devices, axis_names=names, batch_axis_names=names[0], **kw)


def bijective(p):
    flat = ids(p).ravel()
    return sorted(flat.tolist()) == sorted(d.id for d in p.table.devices)


# -- one v4 4x4 slice: one granule, nothing on DCN ---------------------------------------
@pytest.mark.parametrize("shape", [(2, 8), (4, 4), (1, 2, 8)])
def test_single_v4_slice(shape):
    p = plan(shape, tpu_slices((4, 4, 1)))
    assert p.dcn_mesh_shape == (1,) * len(shape) and p.ici_mesh_shape == shape
    assert p.devices.shape == shape and bijective(p)
    assert p.granule_kind == "none"


@pytest.mark.parametrize(
    "shape",
    [
        HybridMeshShape((2, 8), (1, 1)),
        HybridMeshShape((-1, 8), (1, 1)),
        HybridMeshShape((1, 2, 8), (1, 1, -1)),
    ],
)
def test_single_v4_slice_hybrid_forms(shape):
    p = plan(shape, tpu_slices((4, 4, 1)))
    assert p.devices.shape == tuple(
        i * d for i, d in zip(p.ici_mesh_shape, p.dcn_mesh_shape, strict=True)
    )
    assert bijective(p)


# -- two v4 slices ------------------------------------------------------------------------
TWO_V4 = [
    ((2, 16), (1, 16), (2, 1)),
    ((2, 4, 4), (1, 4, 4), (2, 1, 1)),
    ((1, 2, 16), (1, 1, 16), (1, 2, 1)),
    ((2, -1), (1, 16), (2, 1)),
    ((-1, 16), (1, 16), (2, 1)),
    (HybridMeshShape((-1, 16), (2, 1)), (1, 16), (2, 1)),
    (HybridMeshShape((1, -1), (2, 1)), (1, 16), (2, 1)),
    (HybridMeshShape((1, 16), (-1, 1)), (1, 16), (2, 1)),
    (HybridMeshShape((4, 4), (1, -1)), (4, 4), (1, 2)),
]


@pytest.mark.parametrize(("shape", "ici", "dcn"), TWO_V4)
def test_two_v4_slices(shape, ici, dcn):
    p = plan(shape, tpu_slices((4, 4, 1), num_slices=2))
    assert (p.ici_mesh_shape, p.dcn_mesh_shape) == (ici, dcn)
    assert p.granule_kind == "slice" and bijective(p)
    assert_dcn_blocks_are_granules(p)


def test_dcn_neighbours_hold_the_same_chip_position():
    p = plan((2, 16), tpu_slices((4, 4, 1), num_slices=2))
    coords = np.vectorize(lambda d: d.coords, otypes=[object])(p.devices)
    assert (coords[0] == coords[1]).all()


@pytest.mark.parametrize(
    ("shape", "ici", "dcn"),
    [
        ((2, 16, 16), (1, 16, 16), (2, 1, 1)),
        ((-1, 256), (1, 256), (2, 1)),
        ((4, 128), (2, 128), (2, 1)),
    ],
)
def test_two_v5e_16x16_slices(shape, ici, dcn):
    p = plan(shape, tpu_slices((16, 16, 1), num_slices=2, kind="TPU v5 lite"))
    assert (p.ici_mesh_shape, p.dcn_mesh_shape) == (ici, dcn)
    assert bijective(p)
    assert_dcn_blocks_are_granules(p)


# -- 8 GPU nodes of 8 ---------------------------------------------------------------------
GPU_CASES = [
    ((8, 2, 4), (1, 2, 4), (8, 1, 1)),
    ((16, 4), (2, 4), (8, 1)),
    ((-1, 2, 4), (1, 2, 4), (8, 1, 1)),
    (HybridMeshShape((1, 2, 4), (8, 1, 1)), (1, 2, 4), (8, 1, 1)),
    (HybridMeshShape((-1, 2, 4), (-1, 1, 1)), (1, 2, 4), (8, 1, 1)),
    (HybridMeshShape((2, 4), (2, 4)), (2, 4), (2, 4)),
]


@pytest.mark.parametrize("with_slice_index", [True, False])
@pytest.mark.parametrize(("shape", "ici", "dcn"), GPU_CASES)
def test_eight_gpu_nodes(shape, ici, dcn, with_slice_index):
    devices = gpu_nodes(8, with_slice_index=with_slice_index)
    p = plan(shape, devices)
    assert (p.ici_mesh_shape, p.dcn_mesh_shape) == (ici, dcn)
    assert p.granule_kind == ("slice" if with_slice_index else "process")
    assert_dcn_blocks_are_granules(p)  # each node is one contiguous block of the grid
    # Same answer as JAX's own hybrid mesh on the same devices.
    theirs = mesh_utils.create_hybrid_device_mesh(
        ici, dcn, devices, process_is_granule=not with_slice_index
    )
    assert (ids(p) == np.vectorize(lambda d: d.id)(theirs)).all()


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        (HybridMeshShape((1, 2, 4), (4, 1, 1)), "dcn_mesh_shape"),
        (HybridMeshShape((2, 2, 4), (8, 1, 1)), "ici_mesh_shape"),
        (HybridMeshShape((1, 2, 4), (3, -1, 1)), "dcn_mesh_shape"),
        (HybridMeshShape((3, -1, 1), (8, 1, 1)), "ici_mesh_shape"),
    ],
)
def test_eight_gpu_nodes_hybrid_errors(shape, message):
    with pytest.raises(MeshConfigError, match=message):
        plan(shape, gpu_nodes(8))


def test_axlearn_documented_example_on_two_h100_nodes():
    p = plan((1, 2, 8), gpu_nodes(2))
    assert p.dcn_mesh_shape == (1, 2, 1) and p.ici_mesh_shape == (1, 1, 8)


def test_spill_on_eight_gpu_nodes():
    p = plan((2, 32), gpu_nodes(8))
    assert p.dcn_mesh_shape == (2, 4) and p.ici_mesh_shape == (1, 8)
    assert_dcn_blocks_are_granules(p)


def test_nvl72_racks_are_granules_with_hosts_contiguous():
    devices = gpu_nodes(36, 4, kind="NVIDIA GB200", nodes_per_domain=18)
    p = plan((2, 72), devices)
    assert p.dcn_mesh_shape == (2, 1) and p.ici_mesh_shape == (1, 72)
    hosts = np.vectorize(lambda d: d.process_index)(p.devices)
    for row in hosts:
        assert (np.diff(row) >= 0).all()  # each host's four GPUs stand together
        assert len(set(row.tolist())) == 18
    assert set(hosts[0].tolist()).isdisjoint(hosts[1].tolist())


@pytest.mark.parametrize(
    "devices",
    [
        gpu_nodes(18, 4, kind="NVIDIA GB200", nodes_per_domain=18),  # one NVL72 rack
        gpu_nodes(8, 1, nodes_per_domain=8),  # one host, a process per GPU
    ],
    ids=["nvl72-rack", "process-per-gpu"],
)
def test_one_nvlink_domain_is_one_granule(devices):
    # every slice_index is 0: one granule, whatever the process count
    p = plan((-1, 2), devices)
    assert (p.granule_kind, p.num_granules, p.dcn_mesh_shape) == ("slice", 1, (1, 1))
    hosts = np.vectorize(lambda d: d.process_index)(p.devices)
    assert (np.diff(hosts.ravel()) >= 0).all()  # still ordered by (process, id)
    assert plan((-1, 2), devices, granule="process").num_granules == len(np.unique(hosts))


def test_gpu_coords_are_not_read_as_a_torus():
    p = plan((8, 8), gpu_nodes(8))
    assert p.layout.torus is None and p.table.coords is None


# -- granule choices ------------------------------------------------------------------------
def test_granule_modes():
    devices = gpu_nodes(4, 2)
    assert plan((-1, 2), devices, granule="none").dcn_mesh_shape == (1, 1)
    assert plan((-1, 2), devices, granule="process").dcn_mesh_shape == (4, 1)
    custom = plan((-1, 2), devices, granule=lambda d: d.process_index // 2)
    assert custom.dcn_mesh_shape == (2, 1) and custom.granule_kind == "custom"
    with pytest.raises(MeshConfigError, match="no slice_index"):
        plan((-1, 2), gpu_nodes(4, 2, with_slice_index=False), granule="slice")


def test_granules_of_unequal_size_are_an_error():
    devices = cpu_processes(2, 4)[:7]
    with pytest.raises(MeshConfigError, match="different numbers of devices"):
        plan((7,), devices)


def test_cpu_processes_go_on_dcn_and_stay_contiguous():
    p = plan((2, 4), cpu_processes(2, 4))
    assert p.dcn_mesh_shape == (2, 1)
    assert ids(p).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_lower_level_create_device_mesh_returns_the_array():
    arr = lm.create_device_mesh((4, 2), jax.devices())
    assert isinstance(arr, np.ndarray) and arr.shape == (4, 2)
    assert [d.id for d in arr.flat] == list(range(8))


# -- real jax devices -------------------------------------------------------------------------
def test_real_mesh_from_config_on_eight_cpu_devices():
    config = MeshConfig((-1, 4), ("data", "model"))
    explicit = jax.sharding.AxisType.Explicit
    mesh = config.create_device_mesh(axis_types=(explicit, jax.sharding.AxisType.Auto))
    assert isinstance(mesh, jax.sharding.Mesh)
    assert dict(mesh.shape) == {"data": 2, "model": 4}
    assert mesh.axis_types == (explicit, jax.sharding.AxisType.Auto)
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in jax.devices())


def test_plan_defaults_to_jax_devices():
    p = MeshConfig((2, -1), ("data", "model")).plan()
    assert p.shape == {"data": 2, "model": 4} and p.granule_kind == "process"


def test_plan_to_dict_is_json_ready():
    import json

    d = MeshConfig((2, -1), ("data", "model")).plan(jax.devices()).to_dict()
    assert json.loads(json.dumps(d)) == d
    assert set(d) >= {
        "axis_names",
        "ici_mesh_shape",
        "dcn_mesh_shape",
        "shape",
        "devices",
        "granule_kind",
        "hardware",
        "batch_axis_names",
        "quality",
    }
