"""Reading optimised HLO text: loops and their trips, collectives, replica groups, mesh axes."""

from __future__ import annotations

import numpy as np
import pytest

from loadax_mesh.compiler.hlo import HloText, collectives, shape_bytes
from loadax_mesh.compiler.replica_groups import group_axes, replica_groups

MODULE = """HloModule jit_step, is_scheduled=true, entry_computation_layout={(f32[8])->f32[]}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

%inner_body (p: (s32[], f32[64,128])) -> (s32[], f32[64,128]) {
  %p = (s32[], f32[64,128]) parameter(0)
  %x = f32[64,128]{1,0} get-tuple-element(%p), index=1
  %ag = f32[256,128]{1,0} all-gather(%x), channel_id=1, replica_groups=[2,4]<=[8], dimensions={0}
  %rs = f32[64,128]{1,0} reduce-scatter(%ag), channel_id=2, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}, to_apply=%add
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %t = (s32[], f32[64,128]) tuple(%i, %rs)
}

%inner_cond (p: (s32[], f32[64,128])) -> pred[] {
  %p = (s32[], f32[64,128]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%outer_body (q: (s32[], f32[64,128])) -> (s32[], f32[64,128]) {
  %q = (s32[], f32[64,128]) parameter(0)
  %w = (s32[], f32[64,128]) while(%q), condition=%inner_cond, body=%inner_body
  %y = f32[64,128]{1,0} get-tuple-element(%w), index=1
  %ars = f32[64,128]{1,0} all-reduce-start(%y), channel_id=3, replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0'}, to_apply=%add
  %ard = f32[64,128]{1,0} all-reduce-done(%ars)
  %j = s32[] get-tuple-element(%q), index=0
  ROOT %r = (s32[], f32[64,128]) tuple(%j, %ard)
}

%outer_cond (q: (s32[], f32[64,128])) -> pred[] {
  %q = (s32[], f32[64,128]) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (x: f32[64,128]) -> (s32[], f32[64,128]) {
  %x = f32[64,128]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[64,128]) tuple(%zero, %x)
  ROOT %loop = (s32[], f32[64,128]) while(%init), condition=%outer_cond, body=%outer_body, backend_config={"known_trip_count":{"n":"3"}}
  %perm = f32[64,128]{1,0} collective-permute(%x), channel_id=4, source_target_pairs={{0,4},{4,0},{1,5},{5,1},{2,6},{6,2},{3,7},{7,3}}
}
"""


def test_loops_and_multiplicities():
    hlo = HloText(MODULE)
    assert hlo.entry == "main"
    trips = {i.name: t for _, i, t in hlo.loops()}
    assert trips == {"loop": 3, "w": 5}  # known_trip_count; the condition's constant
    assert hlo.multiplicity["outer_body"] == 3
    assert hlo.multiplicity["inner_body"] == 15  # nested loops multiply


def test_collectives_bytes_counts_and_groups():
    found = {c.name: c for c in collectives(HloText(MODULE), 8)}
    assert set(found) == {"ag", "rs", "ars", "perm"}  # the -done half is not counted again
    block = 64 * 128 * 4
    assert (found["ag"].kind, found["ag"].bytes, found["ag"].count) == ("all-gather", 4 * block, 15)
    assert (found["rs"].bytes, found["rs"].count) == (4 * block, 15)  # the input: 4 shards
    assert (found["ars"].kind, found["ars"].bytes, found["ars"].count) == ("all-reduce", block, 3)
    assert found["perm"].kind == "collective-permute" and found["perm"].count == 1
    shape = {"a": 2, "b": 4}
    assert group_axes(found["ag"].groups, shape) == ("b",)
    assert group_axes(found["rs"].groups, shape) == ("b",)
    assert group_axes(found["ars"].groups, shape) == ("a",)
    assert group_axes(found["perm"].groups, shape, pairs=True) == ("a",)


@pytest.mark.parametrize(
    ("text", "groups"),
    [
        ("replica_groups={{0,2},{1,3}}", [[0, 2], [1, 3]]),
        ("replica_groups=[2,2]<=[4]", [[0, 1], [2, 3]]),
        ("replica_groups=[2,2]<=[2,2]T(1,0)", [[0, 2], [1, 3]]),
        ("replica_groups=[4,2]<=[2,2,2]T(0,2,1)", [[0, 2], [1, 3], [4, 6], [5, 7]]),
        ("replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_0'}", [[0, 2], [1, 3]]),
        ("replica_groups=mesh['x'=2,'y'=2,'z'=2] {'x','z'}", [[0, 1, 4, 5], [2, 3, 6, 7]]),
        ("replica_groups={}", [[0, 1, 2, 3]]),
    ],
)
def test_replica_group_forms(text, groups):
    n = np.asarray(groups).size
    assert replica_groups(text, n).tolist() == groups


def test_groups_that_are_no_set_of_axes():
    shape = {"fsdp": 2, "model": 4}
    strided = np.array([[0, 2], [1, 3], [4, 6], [5, 7]])  # every other device along model
    assert group_axes(strided, shape) is None
    assert group_axes(np.array([[0, 1, 2, 3, 4, 5, 6, 7]]), shape) == ("fsdp", "model")
    assert group_axes(None, shape) is None


def test_shape_bytes():
    assert shape_bytes("(bf16[2,3]{1,0}, /*index=1*/f32[4], s32[])") == 12 + 16 + 4


MULTISLICE = """HloModule jit_step, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

ENTRY %main (x: bf16[4,128]) -> bf16[4,128] {
  %x = bf16[4,128]{1,0} parameter(0)
  %ar = bf16[4,128]{1,0} all-reduce(%x), channel_id=5, replica_groups=[2,2]<=[4], to_apply=%add
  %tok = token[] after-all()
  %send = (bf16[4,128]{1,0}, u32[], token[]) send(%ar, %tok), channel_id=5, is_host_transfer=true, frontend_attributes={_xla_megascale_target="{1,2}x{0:1}",_xla_megascale_transfer_type="ALL_REDUCE"}
  %recv = (bf16[4,128]{1,0}, u32[], token[]) recv(%tok), channel_id=4, is_host_transfer=true, frontend_attributes={_xla_megascale_target="{1,2}x{0:1}",_xla_megascale_transfer_type="ALL_REDUCE"}
  ROOT %out = bf16[4,128]{1,0} get-tuple-element(%recv), index=0
}
"""


def test_megascale_sends_are_counted_beside_collectives_of_the_same_channel():
    ids = np.array([100000, 100001, 200000, 200001])  # libtpu's multislice ids, 2 slices of 2
    found = {c.name: c for c in collectives(HloText(MULTISLICE), 4, ids)}
    assert set(found) == {"ar", "send"}  # the recv is the send's other half
    assert (found["send"].kind, found["send"].bytes) == ("all-reduce", 4 * 128 * 2)
    assert found["send"].groups.tolist() == [[0, 2], [1, 3]]  # one group per local index
    assert group_axes(found["send"].groups, {"data": 2, "fsdp": 2}) == ("data",)


WINDOWED = """HloModule jit_step, is_scheduled=true

%ring_body (p: (u32[], bf16[2,128])) -> (u32[], bf16[2,128]) {
  %p = (u32[], bf16[2,128]) parameter(0)
  %i = u32[] get-tuple-element(%p), index=0
  %x = bf16[2,128]{1,0} get-tuple-element(%p), index=1
  %one = u32[] constant(1)
  %two = u32[] constant(2)
  %left = bf16[2,128]{1,0} collective-permute(%x), channel_id=1, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  %right = bf16[2,128]{1,0} collective-permute(%left), channel_id=2, source_target_pairs={{0,3},{1,0},{2,1},{3,2}}
  %unused = u32[] add(%i, %one)
  %next = u32[] add(%i, %two)
  ROOT %t = (u32[], bf16[2,128]) tuple(%next, %right)
}

%ring_cond (p: (u32[], bf16[2,128])) -> pred[] {
  %p = (u32[], bf16[2,128]) parameter(0)
  %i = u32[] get-tuple-element(%p), index=0
  %n = u32[] constant(8)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (x: bf16[2,128]) -> (u32[], bf16[2,128]) {
  %x = bf16[2,128]{1,0} parameter(0)
  %zero = u32[] constant(0)
  %init = (u32[], bf16[2,128]) tuple(%zero, %x)
  ROOT %ring = (u32[], bf16[2,128]) while(%init), condition=%ring_cond, body=%ring_body
}
"""


def test_a_loop_whose_counter_steps_by_two_runs_half_the_trips():
    # The TPU compiler's windowed einsums count 0, 2, 4, 6 < 8: four trips, not eight.
    hlo = HloText(WINDOWED)
    assert {i.name: t for _, i, t in hlo.loops()} == {"ring": 4}
    assert {c.name: c.count for c in collectives(hlo, 4)} == {"left": 4, "right": 4}


def test_a_counter_stepped_through_a_copy_still_steps_by_two():
    # libtpu's windowed einsums inside a 1F1B loop add 2 to copy(counter): 0, 2, 4, 6 < 8 is
    # four trips (read as eight, the loop's FLOPs and collectives were counted twice).
    text = WINDOWED.replace(
        "%next = u32[] add(%i, %two)", "%held = u32[] copy(%i)\n  %next = u32[] add(%held, %two)"
    )
    assert text != WINDOWED
    assert {i.name: t for _, i, t in HloText(text).loops()} == {"ring": 4}


def test_a_peeled_loop_counts_from_the_copy_its_counter_starts_at():
    # MaxText's scanned layers at 48 layers: the first trip peeled into the entry and the loop's
    # counter initialised with copy(constant(1)); here 2, 4, 6 < 8: three trips.
    text = WINDOWED.replace(
        "%zero = u32[] constant(0)\n  %init = (u32[], bf16[2,128]) tuple(%zero, %x)",
        "%two = u32[] constant(2)\n  %start = u32[] copy(%two)\n"
        "  %init = (u32[], bf16[2,128]) tuple(%start, %x)",
    )
    assert text != WINDOWED
    assert {i.name: t for _, i, t in HloText(text).loops()} == {"ring": 3}


SHARD_MAP = """HloModule jit_step, is_scheduled=true

ENTRY %main (x: bf16[4,128]) -> bf16[4,128] {
  %x = bf16[4,128]{1,0} parameter(0)
  %go = bf16[4,128]{1,0} all-to-all(%x), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, metadata={op_name="jit(_step)/jvp()/shard_map/all_to_all" stack_frame_id=3}
  %back = bf16[4,128]{1,0} all-to-all(%go), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, metadata={op_name="jit(_step)/jvp()/shard_map/all_to_all" stack_frame_id=7}
  ROOT %grad = bf16[4,128]{1,0} all-to-all(%back), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, metadata={op_name="jit(_step)/transpose(jvp())/shard_map/all_to_all" stack_frame_id=7}
}
"""


def test_shard_map_collectives_sharing_a_channel_are_each_counted():
    """jax gives shard_map's explicit collectives one channel id; each is its own op (a MoE
    step's dispatch, combine and their gradients), told apart by the op it came from."""
    found = collectives(HloText(SHARD_MAP), 4)
    assert sorted(c.name for c in found) == ["back", "go", "grad"]
    assert all(c.kind == "all-to-all" and c.bytes == 4 * 128 * 2 for c in found)


NO_ORIGIN = """HloModule jit_step, is_scheduled=true

%all-reduce-scatter.9 (input.9: f32[2,256]) -> f32[1,256] {
  %input.9 = f32[2,256]{1,0} parameter(0)
  %all-reduce.47 = f32[2,256]{1,0} all-reduce(%input.9), channel_id=1, replica_groups={{0,2},{1,3}}, to_apply=%add
  %zero = s32[] constant(0)
  ROOT %slice = f32[1,256]{1,0} dynamic-slice(%all-reduce.47, %zero, %zero), dynamic_slice_sizes={1,256}
}

ENTRY %main (x: bf16[4,128], y: f32[2,256]) -> bf16[4,128] {
  %x = bf16[4,128]{1,0} parameter(0)
  %y = f32[2,256]{1,0} parameter(1)
  %kv = bf16[4,128]{1,0} all-reduce(%x), channel_id=1, replica_groups={{0,1},{2,3}}, to_apply=%add
  %sum = f32[1,256]{1,0} fusion(%y), kind=kCustom, calls=%all-reduce-scatter.9
  ROOT %out = bf16[4,128]{1,0} copy(%kv)
}
"""


def test_collectives_without_an_origin_sharing_a_channel_are_each_counted():
    """libtpu leaves some collectives without jax's op name (an all-reduce inside an
    all-reduce-scatter fusion, another on channel 1 elsewhere): told apart by shape and groups."""
    found = collectives(HloText(NO_ORIGIN), 4)
    assert sorted((c.name, c.bytes) for c in found) == [("all-reduce.47", 2 * 256 * 4),
                                                        ("kv", 4 * 128 * 2)]  # fmt: skip


def test_loops_inside_a_conditional_count_every_trip():
    """A loop in a `lax.cond` branch (ring attention's tiles): its trips counted, the
    conditional as its costliest branch (XLA's own rule for one)."""
    import jax
    import jax.numpy as jnp

    from loadax_mesh.compiler.flops import step_flops

    x, matmul = jnp.ones((64, 64)), 2 * 64**3

    def loop(x):
        return jax.lax.fori_loop(0, 10, lambda _, x: jnp.tanh(x @ x), x)

    def branches(i, x):
        return jax.lax.switch(i, [loop, lambda x: x, lambda x: x @ x], x)

    for f, args in ((loop, (x,)), (branches, (0, x))):
        compiled = jax.jit(f).lower(*args).compile()
        assert compiled.cost_analysis()["flops"] == pytest.approx(matmul, rel=0.01)  # once
        assert step_flops(compiled, HloText(compiled.as_text())) == pytest.approx(
            10 * matmul, rel=0.01
        )
