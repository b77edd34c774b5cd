"""Reading an optimised HLO module's text: computations, loop trip counts, and collectives.

The compiler reports a loop body once (docs/facts/libtpu.md, "Loops"); here every
computation gets its multiplicity, how many times one run of the entry runs it (while bodies
times their trip count, nested loops multiplied). Collectives are read with their replica groups
in every form XLA prints (explicit lists, iota, the mesh form), as groups of indices into the
program's device assignment. Pure Python and numpy.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .replica_groups import megascale_groups, replica_groups

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")

_BYTES = {
    "pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2,
    "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8,
    "c64": 8, "c128": 16,
}  # fmt: skip
ARRAY = re.compile(r"\b([a-z]+[0-9a-z]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) \(.*\{$")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%?([\w.\-]+) = ")
_CALLED = re.compile(
    r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)"
)
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")


@dataclass(frozen=True)
class Instruction:
    name: str
    shape: str  # the result shape as printed, tuples included
    opcode: str
    operands: str
    attributes: str

    def called(self) -> list[tuple[str, str]]:
        """(how, computation) for every computation this instruction calls."""
        found = [(m[1], m[2]) for m in _CALLED.finditer(self.attributes)]
        for m in _BRANCHES.finditer(self.attributes):
            found += [("branch", b.strip().lstrip("%")) for b in m[1].split(",") if b.strip()]
        return found


def shape_bytes(shape: str) -> int:
    """Bytes of every array in a shape's text (a tuple's elements summed)."""
    total = 0
    for dtype, dims in ARRAY.findall(shape):
        if dtype in _BYTES:
            total += _BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
    return total


def _split_instruction(line: str) -> Instruction | None:
    match = _INSTRUCTION.match(line)
    if match is None:
        return None
    rest = line[match.end() :]
    if rest.startswith("("):
        end = closing(rest, 0)
        shape, rest = rest[: end + 1], rest[end + 1 :].lstrip()
    else:
        shape, _, rest = rest.partition(" ")
    opcode, paren, rest = rest.partition("(")
    if not paren:
        return None
    end = closing("(" + rest, 0)
    operands, attributes = rest[: end - 1], rest[end:].lstrip(", ")
    return Instruction(match[1], shape, opcode, operands, attributes)


def closing(text: str, start: int) -> int:
    """Index of the bracket closing the one at `start` (round or curly, comments skipped)."""
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if text.startswith("/*", i):
            i = text.index("*/", i) + 2
            continue
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return len(text) - 1


def braced(text: str, key: str) -> str:
    """The `{...}` that follows `key` in an attribute list ("" if absent)."""
    start = text.find(key)
    if start < 0:
        return ""
    start += len(key)
    return text[start : closing(text, start) + 1]


def call_target(call: Instruction) -> str:
    """A custom call's `custom_call_target`."""
    match = re.search(r'custom_call_target="([^"]*)"', call.attributes)
    return match[1] if match else ""


def operand_dims(call: Instruction) -> list[tuple[int, ...]]:
    """A custom call's operands' dims, from `operand_layout_constraints` (the optimised
    module's text names operands without their shapes)."""
    return [dims for _, dims in operand_types(call)]


def operand_types(call: Instruction) -> list[tuple[str, tuple[int, ...]]]:
    """A custom call's operands as (dtype, dims), from `operand_layout_constraints`."""
    text = braced(call.attributes, "operand_layout_constraints=")
    return [(t, tuple(int(d) for d in dims.split(",") if d)) for t, dims in ARRAY.findall(text)]


class HloText:
    """A parsed HLO module text."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.computations: dict[str, list[Instruction]] = {}
        self.roots: dict[str, Instruction] = {}
        self.entry = ""
        name = ""
        current: list[Instruction] | None = None
        for line in text.splitlines():
            header = _HEADER.match(line)
            if header:
                name = header[2]
                current = self.computations.setdefault(name, [])
                if header[1]:
                    self.entry = name
                continue
            if line.rstrip() == "}":  # attribute text may also start a line with "}"
                current = None
            elif current is not None:
                instruction = _split_instruction(line)
                if instruction is not None:
                    current.append(instruction)
                    if line.lstrip().startswith("ROOT "):
                        self.roots[name] = instruction

    @cached_property
    def by_name(self) -> dict[str, Instruction]:
        return {i.name: i for body in self.computations.values() for i in body}

    def trip_count(self, loop: Instruction) -> int | None:
        """A while loop's trip count: from `known_trip_count`, else from its condition's
        `counter < constant` (counter starting at the constant it is initialised with and
        stepping by the constant its body adds; the TPU compiler's windowed einsums step by 2)."""
        known = re.search(r'"known_trip_count":\{"n":"(\d+)"', loop.attributes)
        if known:
            return int(known[1])
        condition = dict(loop.called()).get("condition")
        body = self.computations.get(condition or "", [])
        constants = {i.name: i for i in body if i.opcode == "constant"}
        for i in body:
            if i.opcode == "compare" and "direction=LT" in i.attributes:
                names = _operand_names(i)
                if len(names) == 2 and names[1] in constants:
                    index = self._counter_index(names[0], body)
                    span = int(constants[names[1]].operands) - self._start(loop, index)
                    return -(-span // self._step(loop, index))
        return None

    @staticmethod
    def _counter_index(counter: str, condition: list[Instruction]) -> int | None:
        """Where in the loop's tuple the condition reads its counter."""
        element = next((i for i in condition if i.name == counter), None)
        index = re.search(r"index=(\d+)", element.attributes) if element else None
        return None if index is None else int(index[1])

    def _through_copies(self, name: str) -> Instruction | None:
        """The instruction a chain of copies starts from (a peeled loop's counter is copy(1);
        libtpu's windowed einsums add 2 to copy(counter))."""
        value = self.by_name.get(name)
        while value is not None and value.opcode == "copy":
            value = self.by_name.get(_operand_names(value)[0])
        return value

    def _constant(self, name: str) -> int | None:
        value = self._through_copies(name)
        if value is not None and value.opcode == "constant" and value.operands.isdigit():
            return int(value.operands)
        return None

    def _start(self, loop: Instruction, index: int | None) -> int:
        """The counter's initial value, read through the while's initial tuple (0 if unknown)."""
        init = self.by_name.get(_operand_names(loop)[0])
        if index is None or init is None or init.opcode != "tuple":
            return 0
        return self._constant(_operand_names(init)[index]) or 0

    def _step(self, loop: Instruction, index: int | None) -> int:
        """What the body adds to the counter each trip (1 unless it adds another constant)."""
        root = self.roots.get(dict(loop.called()).get("body") or "")
        if index is None or root is None or root.opcode != "tuple":
            return 1
        update = self.by_name.get(_operand_names(root)[index])
        if update is None or update.opcode != "add":
            return 1
        operands = [self._through_copies(name) for name in _operand_names(update)]
        reads_counter = any(
            o is not None
            and o.opcode == "get-tuple-element"
            and re.search(rf"\bindex={index}\b", o.attributes)
            for o in operands
        )
        steps = [self._constant(o.name) for o in operands if o is not None]
        return next((step for step in steps if step), 1) if reads_counter else 1

    @cached_property
    def multiplicity(self) -> dict[str, int]:
        """How many times one run of the entry runs each reachable computation."""
        edges: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for name, body in self.computations.items():
            for i in body:
                trips = (self.trip_count(i) or 1) if i.opcode == "while" else 1
                for how, callee in i.called():
                    edges[name].append((callee, trips if how in ("body", "condition") else 1))
        order: list[str] = []
        seen: set[str] = set()

        def visit(name: str) -> None:  # depth-first, callees before callers
            seen.add(name)
            for callee, _ in edges[name]:
                if callee not in seen:
                    visit(callee)
            order.append(name)

        visit(self.entry)
        counts = defaultdict(int, {self.entry: 1})
        for name in reversed(order):
            for callee, times in edges[name]:
                counts[callee] += counts[name] * times
        return dict(counts)

    def loops(self) -> list[tuple[str, Instruction, int | None]]:
        """Every while loop: the computation it sits in, the op, its trip count."""
        return [
            (name, i, self.trip_count(i))
            for name, body in self.computations.items()
            for i in body
            if i.opcode == "while"
        ]


@dataclass(frozen=True, eq=False)
class Collective:
    """One collective op of the program."""

    kind: str  # one of COLLECTIVES
    bytes: int  # the full buffer over its group: all-gather's result, reduce-scatter's
    # input, the result of the others; tuples summed
    count: int  # times one step runs it (loop trips multiplied)
    groups: np.ndarray | None  # (groups, members) indices into the device assignment
    name: str


def collectives(
    hlo: HloText, num_devices: int, device_ids: np.ndarray | None = None
) -> list[Collective]:
    """Every collective of the module, each once: async pairs by their start (the `-done` gives
    the result), copies of one op in TPU's async collective fusions by their channel id and
    origin (shard_map's collectives share a channel, each its own origin; the n-th of one origin
    in a computation is the n-th copy, not the first), and
    TPU multislice transfers over DCN (megascale `send`s) by their send. `device_ids` (the ids
    in device-assignment order) maps megascale groups, which name device ids, to positions."""
    done_shape = {}
    for body in hlo.computations.values():
        for i in body:
            if i.opcode.endswith("-done"):
                done_shape[_operand_names(i)[0]] = i.shape
    found: dict[str, Collective] = {}
    for name, body in hlo.computations.items():
        times = hlo.multiplicity.get(name, 0)
        if not times:
            continue
        seen: dict[str, int] = defaultdict(int)  # ops of one origin in this computation so far
        for i in body:
            megascale = _MEGASCALE.search(i.attributes) if i.opcode == "send" else None
            kind = _MEGASCALE_KINDS.get(megascale[1]) if megascale else _kind(hlo, i)
            if kind is None:
                continue
            if megascale:
                groups = megascale_groups(i.attributes, device_ids)
                size = shape_bytes(ARRAY.search(i.shape)[0])  # type: ignore[index]
                gathered = kind == "all-gather"
            else:
                shape = done_shape.get(i.name, i.shape) if i.opcode.endswith("-start") else i.shape
                groups = replica_groups(i.attributes, num_devices)
                size = shape_bytes(shape)
                gathered = kind == "reduce-scatter"
            if gathered and groups is not None:
                size *= groups.shape[1]  # the full buffer: the shard times the group
            channel = re.search(r"channel_id=(\d+)", i.attributes)
            # megascale sends number their channels apart from the collectives beside them;
            # shard_map's explicit collectives all share channel 1, told apart by their source
            # (one without an origin, as libtpu's all-reduce inside an all-reduce-scatter
            # fusion: by its shape and groups, which its copies share)
            found_origin = _ORIGIN.search(i.attributes)
            origin = found_origin[0] if found_origin else f"{i.shape} {groups_text(i.attributes)}"
            send = "send " if megascale else ""
            key = f"{send}channel {channel[1]} {origin}" if channel else i.name
            # one origin run twice in one computation is two ops (a helper called twice, as
            # the MoE block's dispatch and combine: XLA:GPU gives both one frame)
            seen[key] += 1
            key += f" #{seen[key]}"
            if key not in found or found[key].count < times:
                found[key] = Collective(kind, size, times, groups, i.name)
    return list(found.values())


def groups_text(attributes: str) -> str:
    """An instruction's replica groups or source-target pairs as written (empty: none)."""
    found = _GROUPS.search(attributes)
    return found[0] if found else ""


_GROUPS = re.compile(r"(?:replica_groups|source_target_pairs)=(?:\{[{}0-9, ]*\}|\S+)")
# The op an instruction came from (copies of one op keep it): its jax op name and frame.
_ORIGIN = re.compile(r'op_name="[^"]*"(?: stack_frame_id=\d+)?')
_MEGASCALE = re.compile(r'_xla_megascale_transfer_type="(\w+)"')
_MEGASCALE_KINDS = {
    "ALL_REDUCE": "all-reduce",
    "ALL_GATHER": "all-gather",
    "REDUCE_SCATTER": "reduce-scatter",
    "ALL_TO_ALL": "all-to-all",
}


def _operand_names(i: Instruction) -> list[str]:
    return [o.strip().split(" ")[-1].lstrip("%") for o in i.operands.split(",") if o.strip()]


def _kind(hlo: HloText, i: Instruction) -> str | None:
    op = i.opcode.removesuffix("-start")
    if op in COLLECTIVES and not i.opcode.endswith("-done"):
        return op
    if i.opcode == "async-start":  # a wrapped collective: its computation's root says which
        callee = dict(i.called()).get("calls")
        inner = hlo.computations.get(callee or "", [])
        ops = [j.opcode.removesuffix("-start") for j in inner]
        return next((o for o in ops if o in COLLECTIVES), None)
    return None
