"""Replica groups, as the compiled HLO prints them, read into arrays of device-assignment
positions (explicit lists, iota, the mesh form, TPU multislice targets), and the mesh axes
they span. Pure Python and numpy."""

from __future__ import annotations

import json
import math
import re

import numpy as np


def replica_groups(attributes: str, num_devices: int) -> np.ndarray | None:
    """The groups of a collective as an int array (groups, members), from whichever form the
    text uses; collective-permute's source-target pairs as groups of two. None if unreadable."""
    pairs = re.search(r"source_target_pairs=(\{\{.*?\}\})", attributes)
    if pairs:
        return _explicit(pairs[1])
    mesh = _MESH.search(attributes)
    if mesh:
        return _mesh_form(mesh["axes"], mesh["ids"], mesh["spanned"])
    iota = re.search(r"replica_groups=\[([\d,]+)\]<=(\[[\d,]+\](?:T\([\d,]+\))?)", attributes)
    if iota:
        ids = _iota(iota[2])
        return None if ids is None else ids.reshape([int(x) for x in iota[1].split(",")])
    explicit = re.search(r"replica_groups=(\{.*?\}\})", attributes)
    if explicit:
        return _explicit(explicit[1])
    if re.search(r"replica_groups=\{\}", attributes) or "replica_groups" not in attributes:
        return np.arange(num_devices).reshape(1, -1)
    return None


def _explicit(text: str) -> np.ndarray | None:
    try:
        groups = json.loads(text.replace("{", "[").replace("}", "]"))
        return np.array(groups, dtype=np.int64)
    except (ValueError, TypeError):
        return None  # ragged groups


_MESH = re.compile(
    r"replica_groups=mesh\[(?P<axes>[^\]]*)\]"
    r"(?:,\s*device_ids=\((?P<ids>[^)]*\)?)\))?\s*\{(?P<spanned>[^}]*)\}"
)
_MESH_AXIS = re.compile(r"'?([\w.\-]+?)'?=(\d+)")
_GROUP_AXIS = re.compile(r"'?([\w.\-]+?)'?(?::\((\d+)\)(\d+))?$")


def _device_ids(text: str) -> np.ndarray | None:
    """A mesh's device ids: an iota (below) or the ids listed, `8,3,7,...`."""
    if re.fullmatch(r"\d+(,\d+)*", text.strip()):
        return np.array([int(x) for x in text.split(",")])
    return _iota(text)


def _iota(text: str) -> np.ndarray | None:
    """XLA's iota tile assignment `[dims]` or `[dims]T(perm)`: arange over dims, transposed,
    flattened."""
    match = re.fullmatch(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", text.strip())
    if match is None:
        return None
    dims = [int(x) for x in match[1].split(",")]
    ids = np.arange(math.prod(dims)).reshape(dims)
    if match[2]:
        ids = ids.transpose([int(x) for x in match[2].split(",")])
    return ids.reshape(-1)


def _mesh_form(axes_text: str, ids_text: str | None, spanned_text: str) -> np.ndarray | None:
    """XLA's mesh form: `mesh['a'=4,'b'=2], device_ids=([2,4]T(1,0)) {'a'}` groups the devices
    of the mesh (its ids in row-major order: iota, or `device_ids`) along the named axes, the
    members ordered as the axes are listed. A sub-axis `'a':(pre)size` is the middle factor
    when axis a is split into [pre, size, rest] (several on one axis split it further)."""
    axes = [(name, int(size)) for name, size in _MESH_AXIS.findall(axes_text)]
    total = math.prod(n for _, n in axes)
    ids = np.arange(total) if ids_text is None else _device_ids(ids_text)
    refs = [_GROUP_AXIS.fullmatch(a.strip()) for a in spanned_text.split(",")]
    names = [a for a, _ in axes]
    if not axes or ids is None or ids.size != total or any(r is None for r in refs):
        return None
    parsed = [(r[1], int(r[2] or 1), int(r[3] or 0)) for r in refs if r is not None]
    if any(name not in names for name, _, _ in parsed):
        return None
    dims: list[int] = []  # the mesh reshaped: every grouped (sub-)axis one dimension
    where: dict[int, int] = {}  # listed position -> its dimension in `dims`
    for name, size in axes:
        placed = 1
        for pre, sub, k in sorted(
            (p, s or size, k) for k, (n, p, s) in enumerate(parsed) if n == name
        ):
            if pre % placed or size % (pre * sub):
                return None
            if pre > placed:
                dims.append(pre // placed)
            where[k] = len(dims)
            dims.append(sub)
            placed = pre * sub
        if placed < size:
            dims.append(size // placed)
    inner = [where[k] for k in range(len(parsed))]
    outer = [d for d in range(len(dims)) if d not in inner]
    size = math.prod(dims[d] for d in inner)
    return ids.reshape(dims).transpose(outer + inner).reshape(-1, size)


def varying_axes(groups: np.ndarray | None, mesh_shape: dict[str, int]) -> tuple[str, ...]:
    """The mesh axes along which members of a group differ (device-assignment index =
    row-major mesh position); () when unreadable."""
    if groups is None or not groups.size or groups.max() >= math.prod(mesh_shape.values()):
        return ()
    coords = np.stack(np.unravel_index(groups, tuple(mesh_shape.values())), axis=-1)
    varies = (coords != coords[:, :1]).any(axis=(0, 1))
    return tuple(n for n, v in zip(mesh_shape, varies, strict=True) if v)


def group_axes(
    groups: np.ndarray | None, mesh_shape: dict[str, int], *, pairs: bool = False
) -> tuple[str, ...] | None:
    """The mesh axes a collective's groups span, when every group is exactly the sub-grid of
    those axes through its members; None otherwise. With `pairs` (collective-permute's
    source-target pairs) the axes the pairs differ along."""
    spanned = varying_axes(groups, mesh_shape)
    if not spanned or groups is None:
        return None
    if pairs:
        return spanned
    size = math.prod(mesh_shape[n] for n in spanned)
    distinct = bool((distinct_per_row(groups) == groups.shape[1]).all())
    return spanned if size == groups.shape[1] and distinct else None


def distinct_per_row(a: np.ndarray) -> np.ndarray:
    """How many distinct values each row of a 2-d array holds."""
    ordered = np.sort(a, axis=1)
    return 1 + (ordered[:, 1:] != ordered[:, :-1]).sum(axis=1)


def megascale_groups(attributes: str, device_ids: np.ndarray | None) -> np.ndarray | None:
    """A megascale transfer's groups as device-assignment positions. The target is either
    explicit groups of device ids, or `{1,2}x{0:7}`: slices (device id // 100000, as libtpu
    numbers multislice devices) times local indices, one group per local index."""
    if device_ids is None:
        return None
    target = re.search(r"_xla_megascale_target=(\{\{[^=]*?\}\}|\"[^\"]*\")", attributes)
    if target is None:
        return None
    text = target[1].strip('"')
    compact = re.fullmatch(r"\{([\d,]+)\}x\{(\d+):(\d+)\}", text)
    if compact:
        slices = np.array([int(x) for x in compact[1].split(",")])
        local = np.arange(int(compact[2]), int(compact[3]) + 1)
        ids = local[:, None] + 100000 * slices[None, :]
    else:
        parsed = _explicit(text)
        if parsed is None:
            return None
        ids = parsed
    order = np.argsort(device_ids)
    found = np.minimum(np.searchsorted(device_ids, ids, sorter=order), len(order) - 1)
    positions = order[found]
    return positions if (device_ids[positions] == ids).all() else None
