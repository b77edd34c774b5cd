"""The 1F1B timetable (workload/timetable.py, no jax): every item's input is there the tick it
runs, a stage holds its items from forward to backward only ((R + 1) S - 2 s - 1, not M R), the
three loops cost GPipe's (M R + S - 1) forwards and backwards, and the last stage's backward
of a micro-batch starts the tick its forward ends."""

from __future__ import annotations

import pytest

from loadax_mesh.workload.timetable import item, one_f_one_b

CASES = [(2, 1, 2), (2, 1, 5), (4, 1, 4), (4, 1, 16), (2, 2, 2), (2, 2, 4), (4, 2, 8), (4, 2, 16)]


def _ticks(rows):
    """{(stage, micro-batch, repeat): tick} of the slots that run."""
    return {(s, m, r): t for t, row in enumerate(rows) for s, (on, m, r, _) in enumerate(row) if on}


@pytest.mark.parametrize(("S", "R", "M"), CASES)
def test_every_input_is_there_the_tick_its_item_runs(S, R, M):
    tt = one_f_one_b(S, R, M)
    fwd, bwd = _ticks(tt.forward), _ticks(tt.backward)
    every = {(s, m, r) for s in range(S) for m in range(M) for r in range(R)}
    assert set(fwd) == set(bwd) == every
    for (s, m, r), t in fwd.items():  # sent the tick before, by the stage before
        if s:
            assert fwd[s - 1, m, r] == t - 1
        elif r:  # round the ring: the last stage's output of the repeat before
            assert fwd[S - 1, m, r - 1] == t - 1
    for (s, m, r), t in bwd.items():
        if s == S - 1 and r == R - 1:  # the loss in between, same tick
            assert fwd[s, m, r] == t
        elif s < S - 1:
            assert bwd[s + 1, m, r] == t - 1
        else:
            assert bwd[0, m, r + 1] == t - 1
        assert t >= fwd[s, m, r]


@pytest.mark.parametrize(("S", "R", "M"), CASES)
def test_a_stage_keeps_its_items_in_flight_in_slots_no_two_at_once(S, R, M):
    tt = one_f_one_b(S, R, M)
    for s in range(S):
        live: dict[int, tuple[int, int]] = {}
        for t in range(tt.ticks):
            on, m, r, slot = tt.forward[t][s]
            if on:
                assert slot not in live and 0 <= slot < tt.slots
                live[slot] = (m, r)
            on, m, r, slot = tt.backward[t][s]
            if on:
                assert live.pop(slot) == (m, r)
        assert not live
    # stage s holds (R + 1) S - 2 s - 1 items (2 (S - s) - 1 at one repeat), or all M R
    assert tt.held == tuple(min((R + 1) * S - 2 * s - 1, M * R) for s in range(S))
    assert tt.slots == max(tt.held)
    if M > S:  # fewer than GPipe's all of them
        assert tt.slots < M * R


@pytest.mark.parametrize(("S", "R", "M"), CASES)
def test_the_loops_cost_gpipes_forwards_and_backwards(S, R, M):
    tt = one_f_one_b(S, R, M)
    assert tt.warmup + tt.steady + tt.cooldown == tt.ticks
    forwards, backwards = tt.warmup + tt.steady, tt.steady + tt.cooldown
    assert forwards == backwards == M * R + S - 1  # GPipe's iterations, the bubble (S - 1)/R
    assert not any(any(b[0] for b in row) for row in tt.backward[: tt.warmup])
    assert not any(any(f[0] for f in row) for row in tt.forward[tt.warmup + tt.steady :])


def test_the_interleaved_order_runs_groups_of_s_micro_batches_repeat_by_repeat():
    order = [item(k, stages=2, repeats=2) for k in range(8)]
    assert order == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1)]
    assert [item(k, stages=4, repeats=1) for k in range(6)] == [(k, 0) for k in range(6)]
    # 8 stages of 5 chunks, 128 micro-batches (Megatron's LLaMA-3 70B run, G7): stage 0 holds
    # 47 chunks' inputs, 1.2 stages' layers
    assert one_f_one_b(8, 5, 128).held[0] == 47
