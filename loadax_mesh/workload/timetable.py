"""The 1F1B schedule's timetable (TrainSpec.pipeline_schedule "1f1b"): which micro-batch and
chunk each stage runs forward and backward at each tick, and where it keeps the input of each
micro-batch in flight. Pure Python: the step (pipeline_1f1b.py) runs it and the cost model can
read what a stage holds.

One SPMD program runs every stage in lockstep, a tick a forward slot then a backward slot, and
an activation (or a gradient) moves one stage a tick. A stage's work items are (micro-batch,
repeat) pairs in groups of S micro-batches: for each group, repeat 0 of its S micro-batches,
then repeat 1, ... (Megatron's interleaved order; R = 1 is plain 1F1B). Stage s runs forward
item k at tick k + s; the last stage runs the backward of a micro-batch's last chunk in the
tick its forward ends (the loss in between), and backward item k (repeats in reverse) reaches
stage s at tick k + (R + 1) S - 2 - s. So the output of stage S - 1 at one repeat is the input
of stage 0 at the next the tick after (no waiting, hence M a multiple of S when R > 1), and a
stage holds an item from its forward to its backward: (R + 1) S - 2 s - 1 items (at most M R),
2 (S - s) - 1 micro-batches at R = 1. Megatron's 1F1B holds S - s: its stages run forwards
and backwards out of step, which one program whose stages run the same instructions cannot;
its interleaved 1F1B about S + (S - 1) / R stages' worth, as (R + 1) S - 1 chunks of 1 / R.

The ticks with forwards only (warm-up), both, and backwards only (cool-down) run as three
loops, the first without the backward slot and the last without the forward one, so the
schedule costs (M R + S - 1) chunk forwards and backwards: GPipe's bubble, (S - 1) / R.
"""

from __future__ import annotations

from dataclasses import dataclass

# One slot of one stage at one tick: (runs, micro-batch, repeat, where its input is kept).
Slot = tuple[bool, int, int, int]
IDLE: Slot = (False, 0, 0, 0)


@dataclass(frozen=True)
class Timetable:
    """`forward[t][s]` and `backward[t][s]`: stage s's slots at tick t; `slots` the most items
    any stage keeps at once (the buffer's length), `held[s]` stage s's most; `warmup`,
    `steady` and `cooldown` the ticks of the three loops (forwards only, both, backwards
    only)."""

    forward: tuple[tuple[Slot, ...], ...]
    backward: tuple[tuple[Slot, ...], ...]
    slots: int
    held: tuple[int, ...]
    warmup: int
    steady: int
    cooldown: int

    @property
    def ticks(self) -> int:
        return len(self.forward)


def item(k: int, *, stages: int, repeats: int) -> tuple[int, int]:
    """Work item k of a stage's forward order: (micro-batch, repeat)."""
    group, within = divmod(k, stages * repeats)
    repeat, j = divmod(within, stages)
    return group * stages + j, repeat


def one_f_one_b(stages: int, repeats: int, microbatches: int) -> Timetable:
    """The timetable of S `stages`, R `repeats` and M `microbatches` (M >= S; a multiple of
    S when R > 1, which `stages.pipeline_stages` checks)."""
    S, R, M = stages, repeats, microbatches
    assert M >= S and (R == 1 or M % S == 0), (S, R, M)
    items = M * R
    delay = (R + 1) * S - 2  # backward item k reaches stage s at tick k + delay - s
    ticks = items + delay
    fwd = [[IDLE] * S for _ in range(ticks)]
    bwd = [[IDLE] * S for _ in range(ticks)]
    held = []
    for s in range(S):
        where: dict[tuple[int, int], int] = {}
        free: list[int] = []
        most = 0
        for t in range(ticks):
            k = t - s
            if 0 <= k < items:  # forward first: an item's slot is taken before one is freed
                micro, repeat = item(k, stages=S, repeats=R)
                slot = min(free) if free else len(where)
                free = [f for f in free if f != slot]
                where[micro, repeat] = slot
                fwd[t][s] = (True, micro, repeat, slot)
                most = max(most, len(where))
            k = t - delay + s
            if 0 <= k < items:
                micro, repeat = item(k, stages=S, repeats=R)
                repeat = R - 1 - repeat
                slot = where.pop((micro, repeat))  # KeyError: a backward before its forward
                free.append(slot)
                bwd[t][s] = (True, micro, repeat, slot)
        held.append(most)
    first_backward = min(t for t in range(ticks) if any(b[0] for b in bwd[t]))
    last_forward = max(t for t in range(ticks) if any(f[0] for f in fwd[t]))
    return Timetable(
        forward=tuple(tuple(row) for row in fwd),
        backward=tuple(tuple(row) for row in bwd),
        slots=max(held),
        held=tuple(held),
        warmup=first_backward,
        steady=last_forward + 1 - first_backward,
        cooldown=ticks - last_forward - 1,
    )
