"""Strategy presets: configs/presets/<name>.toml as MeshConfig fields, with axis-size overrides.

A preset file holds `description`, `fill_order`, `[overrides]` (keyword -> `{axis, part}`) and
`[config]`, MeshConfig's fields in the form `MeshConfig.from_dict` reads (mesh_rules as
`[[config.mesh_rules]]` tables). Every axis name is accepted as a keyword too. This module works
on the checked fields (`ConfigFields`); `MeshConfig.from_preset` makes them a MeshConfig.

An override `keyword=N` fixes that axis's size to N in the default shape and in every rule:
1. Per axis, the shape's total (ICI x DCN; -1 where open) is taken and the axis set to N. If that
   closed the only open axis, the first axis of `fill_order` not overridden becomes the rest (-1).
2. With at most one open axis left the result is a plain shape: the planner's default split
   places granules on the leftmost axes (presets order axes from least to most communication
   intensive), so an axis larger than one granule still plans.
3. A HybridMeshShape rule with two open axes left (one filling each granule, one filling the
   granule count) stays hybrid: N goes into the keyword's `part` (ici or dcn), 1 into the other.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from ._configs import config_path
from .config_data import ConfigFields, fields_from_data, first_axis_shape
from .errors import MeshConfigError
from .shapes import HybridMeshShape, MeshShape, check_size

_KEYS = ("description", "fill_order", "overrides", "config")
_PARTS = ("ici", "dcn")

# Presets computed rather than read from a file: name -> a function of the preset's options that
# returns a MeshConfig. The package's face (loadax_mesh/__init__.py) registers "auto", the cost
# model's choice, so the planner's core holds no arrow up to the cost model.
COMPUTED: dict[str, Callable[..., Any]] = {}


@dataclass(frozen=True)
class Preset:
    """One strategy preset as its file describes it."""

    name: str
    description: str
    config: ConfigFields
    overrides: tuple[tuple[str, str, str], ...]  # (keyword, axis, part), axis names included
    fill_order: tuple[str, ...]

    def keywords(self) -> dict[str, str]:
        """Accepted override keyword -> the axis it sizes."""
        return {k: axis for k, axis, _ in self.overrides}


def list_presets() -> list[str]:
    """The names of the shipped presets.

    Returns:
        The names of `configs/presets/*.toml`, sorted.
    """
    return sorted(p.stem for p in config_path("presets").glob("*.toml"))


def strategy_names() -> list[str]:
    """What `MeshConfig.from_preset` and the CLI's --strategy take: the computed presets ("auto":
    the cost model's choice) and every preset file."""
    return [*COMPUTED, *list_presets()]


def get_preset(name: str) -> Preset:
    """Read and check one preset file (once per process). Users reach it through
    `MeshConfig.from_preset` or --strategy, which also take "auto": the error lists it."""
    if not isinstance(name, str) or name not in list_presets():
        accepted = ", ".join(strategy_names())
        raise MeshConfigError(f"preset={name!r} is not a preset; accepted: {accepted}")
    return _read_preset(name)


@cache
def _read_preset(name: str) -> Preset:
    path = config_path("presets", f"{name}.toml")
    with open(path, "rb") as f:
        data = tomllib.load(f)
    where = f"preset {name} ({path.name})"
    unknown = sorted(set(data) - set(_KEYS))
    if unknown or "config" not in data:
        raise MeshConfigError(f"{where}: unknown keys {unknown} or no [config]; accepted {_KEYS}")
    config = ConfigFields(**fields_from_data(data["config"]))
    axes = config.mesh_axis_names
    overrides: list[tuple[str, str, str]] = []
    for keyword, spec in data.get("overrides", {}).items():
        if not isinstance(spec, dict) or set(spec) != {"axis", "part"}:
            raise MeshConfigError(f"{where}: overrides.{keyword}={spec!r}; accepted {{axis, part}}")
        if spec["axis"] not in axes or spec["part"] not in _PARTS:
            raise MeshConfigError(
                f"{where}: overrides.{keyword}={spec!r}; axis must be one of {axes}, part one "
                f"of {_PARTS}"
            )
        overrides.append((keyword, spec["axis"], spec["part"]))
    declared = {axis: part for _, axis, part in overrides}
    taken = {k for k, _, _ in overrides}
    overrides += [(a, a, declared.get(a, "ici")) for a in axes if a not in taken]
    fill = tuple(data.get("fill_order", ()))
    if not fill or any(a not in axes for a in fill):
        raise MeshConfigError(f"{where}: fill_order={list(fill)} must name axes of {axes}")
    return Preset(name, data.get("description", ""), config, tuple(overrides), fill)


def load_preset(name: str, **overrides: Any) -> ConfigFields:
    """The preset's fields with `overrides` (e.g. `tp=8`) applied to its shape and rules."""
    preset = get_preset(name)
    if not overrides:
        return preset.config
    config = preset.config
    axes = config.mesh_axis_names
    by_keyword = {k: (a, p) for k, a, p in preset.overrides}
    sizes: dict[int, int] = {}
    parts: dict[int, str] = {}
    for keyword, value in overrides.items():
        if keyword not in by_keyword:
            keywords: dict[str, list[str]] = {}  # by the axis they size
            for k, a, _ in preset.overrides:
                keywords.setdefault(a, []).append(k)
            accepted = ", ".join(" or ".join(ks) for ks in keywords.values())
            raise MeshConfigError(
                f"preset {name}: override {keyword}={value!r} is unknown; accepted: {accepted}"
            )
        axis, part = by_keyword[keyword]
        i = axes.index(axis)
        if i in sizes:
            raise MeshConfigError(
                f"preset {name}: override {keyword}={value!r} sizes axis {axis!r} a second time; "
                "accepted: one keyword per axis"
            )
        sizes[i] = check_size(value, field=f"preset {name}: override {keyword}")
        parts[i] = part
    fill = [axes.index(a) for a in preset.fill_order]

    def apply(shape: MeshShape | HybridMeshShape | None) -> MeshShape | HybridMeshShape:
        if shape is None:
            shape = first_axis_shape(len(axes))
        return override_shape(shape, sizes, parts, fill)

    rules = config.mesh_rules
    return ConfigFields(
        mesh_shape=apply(config.mesh_shape),
        mesh_axis_names=axes,
        batch_axis_names=config.batch_axis_names,
        mesh_rules=None if rules is None else tuple((r, apply(v)) for r, v in rules),
    )


def override_shape(
    shape: MeshShape | HybridMeshShape,
    sizes: dict[int, int],
    parts: dict[int, str],
    fill: list[int],
) -> MeshShape | HybridMeshShape:
    """`shape` with axis `i` fixed to `sizes[i]`, by the rules in this module's docstring."""
    if isinstance(shape, HybridMeshShape):
        pairs = zip(shape.ici_mesh_shape, shape.dcn_mesh_shape, strict=True)
        totals = [-1 if -1 in (i, d) else i * d for i, d in pairs]
    else:
        totals = list(shape)
    dims = [sizes.get(i, d) for i, d in enumerate(totals)]
    if -1 in totals and -1 not in dims:
        rest = next((i for i in fill if i not in sizes), None)
        if rest is not None:
            dims[rest] = -1
    if dims.count(-1) <= 1 or not isinstance(shape, HybridMeshShape):
        return tuple(dims)
    ici, dcn = list(shape.ici_mesh_shape), list(shape.dcn_mesh_shape)
    for i, size in sizes.items():
        ici[i], dcn[i] = (size, 1) if parts[i] == "ici" else (1, size)
    return HybridMeshShape(tuple(ici), tuple(dcn))
