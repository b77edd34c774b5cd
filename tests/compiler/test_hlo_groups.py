"""Reading compiled HLO text: replica groups in every form XLA prints, async collectives in
loops, and the split of a collective's bytes into inside and across hosts. Pure Python."""

from __future__ import annotations

import numpy as np
import pytest

from loadax_mesh.compiler.hlo import HloText, collectives
from loadax_mesh.compiler.host_split import across_bytes, across_fraction
from loadax_mesh.compiler.replica_groups import replica_groups

HOSTS_2X8 = np.repeat([0, 1], 8)  # 16 devices, 8 per host, positions in mesh order
FSDP_GROUPS = [list(range(8)), list(range(8, 16))]
DATA_GROUPS = [[k, k + 8] for k in range(8)]


# Strings as the GPU compiler printed them for two hosts of 8 H100s (tiny model, fsdp preset,
# and a 4-layer MLP with fsdp over 2 x 8), and as XLA's own tests print them.
@pytest.mark.parametrize(
    ("text", "groups"),
    [
        (
            "replica_groups=mesh['axis_0'=8,'axis_1'=1,'axis_2'=2], device_ids=([2,8]T(1,0)) "
            "{'axis_0'}, dimensions={0}, use_global_device_ids=true",
            FSDP_GROUPS,
        ),
        (
            "replica_groups=mesh['axis_0'=8,'axis_1'=1,'axis_2'=1,'axis_3'=2], "
            "device_ids=([2,8]T(1,0)) {'axis_0'}, dimensions={0}",
            FSDP_GROUPS,
        ),
        (
            "replica_groups=mesh['axis_0'=1,'axis_1'=8,'axis_2'=2], device_ids=([2,8]T(1,0)) "
            "{'axis_2'}, use_global_device_ids=true, to_apply=%add",
            DATA_GROUPS,
        ),
        (
            "replica_groups=mesh['axis_0'=2,'axis_1'=8,'axis_2'=1,'axis_3'=1] {'axis_1'}, "
            "dimensions={2}",
            FSDP_GROUPS,
        ),
        ("replica_groups=mesh['axis_0'=16,'axis_1'=1,'axis_2'=1] {'axis_0'}", [list(range(16))]),
        ("replica_groups=[2,8]<=[16], dimensions={0}", FSDP_GROUPS),
        (
            "replica_groups=[4,4]<=[2,4,2]T(0,2,1), to_apply=%add",
            [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]],
        ),
        (
            "replica_groups={{0,2,4,6},{8,10,12,14},{1,3,5,7},{9,11,13,15}}, dimensions={0}",
            [[0, 2, 4, 6], [8, 10, 12, 14], [1, 3, 5, 7], [9, 11, 13, 15]],
        ),
        ("replica_groups={{0,8},{1,9},{2,10},{3,11},{4,12},{5,13},{6,14},{7,15}}", DATA_GROUPS),
        ("source_target_pairs={{0,8},{8,0}}", [[0, 8], [8, 0]]),
    ],
)
def test_replica_group_forms(text, groups):
    assert replica_groups(text, 16).tolist() == groups


@pytest.mark.parametrize(
    ("spanned", "groups"),
    [  # xla/hlo/ir/replica_group_test.cc, MaterializedReplicaGroupsWithSubaxes (mesh a=6, b=6)
        ("'a':(1)2", [[k, k + 18] for k in range(18)]),
        ("'a':(3)2", [[k + 12 * j, k + 12 * j + 6] for j in range(3) for k in range(6)]),
        ("'b':(1)3", [[k, k + 2, k + 4] for j in range(6) for k in (6 * j, 6 * j + 1)]),
        (
            "'a':(1)3,'b':(1)3",
            [
                [0, 2, 4, 12, 14, 16, 24, 26, 28],
                [1, 3, 5, 13, 15, 17, 25, 27, 29],
                [6, 8, 10, 18, 20, 22, 30, 32, 34],
                [7, 9, 11, 19, 21, 23, 31, 33, 35],
            ],
        ),
        (
            "'a':(3)2,'b':(3)2",
            [[k, k + 1, k + 6, k + 7] for j in range(3) for k in (12 * j, 12 * j + 2, 12 * j + 4)],
        ),
    ],
)
def test_mesh_form_sub_axes_as_xla_materialises_them(spanned, groups):
    assert replica_groups(f"replica_groups=mesh['a'=6,'b'=6] {{{spanned}}}", 36).tolist() == groups


def test_mesh_form_sub_axes_match_the_iota_form():
    """XLA's test MaterializedReplicaGroupsMatchExpectedV2: {a:(4)2, a:(1)2} on mesh a=8 is
    [2,4]<=[2,2,2]T(1,2,0)."""
    mesh = replica_groups("replica_groups=mesh['a'=8] {'a':(4)2,'a':(1)2}", 8)
    iota = replica_groups("replica_groups=[2,4]<=[2,2,2]T(1,2,0)", 8)
    assert mesh.tolist() == iota.tolist()


def test_mesh_form_with_listed_device_ids():
    """XLA's test MaterializedReplicaGroupsRespectNonIotaDeviceOrdering: devices {{3,1},{0,2}}."""
    assert replica_groups(
        "replica_groups=mesh['x'=2,'y'=2], device_ids=(3,1,0,2) {'x'}", 4
    ).tolist() == [[3, 0], [1, 2]]
    assert replica_groups(
        "replica_groups=mesh['x'=2,'y'=2], device_ids=(3,1,0,2) {'y'}", 4
    ).tolist() == [[3, 1], [0, 2]]


@pytest.mark.parametrize(
    "text",
    [
        "replica_groups=mesh['a'=8] {'b'}",  # no such axis
        "replica_groups=mesh['a'=8] {'a':(3)2}",  # 3 x 2 does not divide 8
        "replica_groups=mesh['a'=8], device_ids=([2,2]) {'a'}",  # 4 ids for 8 devices
        "replica_groups={{0,1},{2}}",  # ragged
    ],
)
def test_unreadable_groups_are_none(text):
    assert replica_groups(text, 8) is None


LOOP = """HloModule step, entry_computation_layout={()->bf16[1024,4096]{1,0}}

%body (p: (s32[], bf16[128,4096])) -> (s32[], bf16[128,4096]) {
  %p = (s32[], bf16[128,4096]{1,0}) parameter(0)
  %x = bf16[128,4096]{1,0} get-tuple-element(%p), index=1
  %all-gather-start = ((bf16[128,4096]{1,0}, bf16[128,4096]{1,0}), (bf16[1024,4096]{1,0}, bf16[1024,4096]{1,0})) all-gather-start(%x, %x), channel_id=1, replica_groups=mesh['axis_0'=8,'axis_1'=1,'axis_2'=2], device_ids=([2,8]T(1,0)) {'axis_0'}, dimensions={0}, use_global_device_ids=true
  %all-gather-done = (bf16[1024,4096]{1,0}, bf16[1024,4096]{1,0}) all-gather-done(%all-gather-start)
  %all-reduce-start = bf16[128,4096]{1,0} all-reduce-start(%x), channel_id=2, replica_groups={{0,8},{1,9},{2,10},{3,11},{4,12},{5,13},{6,14},{7,15}}, use_global_device_ids=true, to_apply=%add
  %all-reduce-done = bf16[128,4096]{1,0} all-reduce-done(%all-reduce-start)
  ROOT %t = (s32[], bf16[128,4096]{1,0}) tuple(%i, %all-reduce-done)
}

ENTRY %main () -> bf16[1024,4096] {
  %w = (s32[], bf16[128,4096]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"4"}}
}
"""


def test_async_collectives_in_a_loop():
    found = {c.kind: c for c in collectives(HloText(LOOP), 16)}
    gather, reduce = found["all-gather"], found["all-reduce"]
    assert (gather.count, reduce.count) == (4, 4)
    assert gather.bytes == 2 * 1024 * 4096 * 2  # both gathered results, read from -done
    assert reduce.bytes == 128 * 4096 * 2
    assert gather.groups.tolist() == FSDP_GROUPS and reduce.groups.tolist() == DATA_GROUPS


# -- inside and across hosts ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["all-gather", "reduce-scatter", "all-reduce"])
def test_ring_collectives_cross_hosts_once_per_host(kind):
    groups = np.array(FSDP_GROUPS)
    assert across_fraction(kind, groups, HOSTS_2X8) == 0.0  # each group inside one host
    assert across_fraction(kind, np.array(DATA_GROUPS), HOSTS_2X8) == 1.0  # 2 steps, both cross
    everyone = np.arange(16).reshape(1, 16)
    assert across_fraction(kind, everyone, HOSTS_2X8) == 2 / 16  # 16 steps, 2 between hosts
    hosts_4x4 = np.repeat([0, 1, 2, 3], 4)
    mixed = np.array([[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]])
    assert across_fraction(kind, mixed, hosts_4x4) == (2 / 4 + 2 / 4 + 0 + 0) / 4
    assert across_bytes(kind, 1000, everyone, HOSTS_2X8) == 125


def test_all_to_all_sends_what_other_hosts_hold():
    group = np.array([[0, 1, 8, 9]])  # 2 members on each host: half of each buffer crosses
    assert across_fraction("all-to-all", group, HOSTS_2X8) == 0.5
    assert (
        across_fraction("all-to-all", np.array([[0, 1, 2, 8]]), HOSTS_2X8) == (1 + 1 + 1 + 3) / 16
    )


def test_collective_permute_counts_pairs_between_hosts():
    pairs = np.array([[0, 1], [1, 8], [8, 9], [9, 0]])
    assert across_fraction("collective-permute", pairs, HOSTS_2X8) == 0.5


def test_unreadable_groups_have_no_split():
    assert across_fraction("all-reduce", None, HOSTS_2X8) is None
    assert across_bytes("all-gather", 100, np.array([[0, 16]]), HOSTS_2X8) is None
