import numpy as np

import loadax_mesh as lm
from tests.standins import gpu_nodes, tpu_slices


def test_gpu_spill_split():
    plan = lm.plan_mesh((2, 32), gpu_nodes(8), axis_names=("data", "model"))
    assert plan.dcn_mesh_shape == (2, 4) and plan.ici_mesh_shape == (1, 8)


def test_tpu_two_slices_blocks_are_granules():
    plan = lm.plan_mesh((2, 16), tpu_slices((4, 4, 1), num_slices=2), axis_names=("data", "m"))
    slices = np.vectorize(lambda d: d.slice_index)(plan.devices)
    assert (slices[0] == 0).all() and (slices[1] == 1).all()
