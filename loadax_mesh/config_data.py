"""MeshConfig's four fields, below MeshConfig: checked once, and their plain-data form.

`ConfigFields` validates and normalises the fields (lists become tuples, `None` becomes "all
devices on the first axis"); `MeshConfig` (config.py) adds choosing and planning on top. The
planner's `plan_mesh` and the presets check what they are given here, so neither needs
MeshConfig. `fields_from_data` reads the JSON/TOML form that `ConfigFields.to_dict` writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import MeshConfigError
from .rules import check_regex
from .shapes import HybridMeshShape, MeshShape, check_shape

ShapeValue = MeshShape | HybridMeshShape | None
KEYS = ("mesh_shape", "mesh_axis_names", "batch_axis_names", "mesh_rules")


@dataclass(frozen=True)
class ConfigFields:
    """Axis names, a shape with at most one -1, batch axes and regex mesh rules, validated
    when built. `mesh_shape=None` (and a rule value of None) means all devices on the first
    axis."""

    mesh_shape: MeshShape | HybridMeshShape | None
    mesh_axis_names: tuple[str, ...]
    batch_axis_names: str | tuple[str, ...] = "data"
    mesh_rules: tuple[tuple[str, ShapeValue], ...] | None = None

    def __post_init__(self) -> None:
        names = _check_names(self.mesh_axis_names, field="mesh_axis_names")
        object.__setattr__(self, "mesh_axis_names", names)
        shape = self.mesh_shape
        shape = (
            first_axis_shape(len(names))
            if shape is None
            else _check_value(shape, field="mesh_shape", num_axes=len(names))
        )
        object.__setattr__(self, "mesh_shape", shape)
        batch = _check_names(self.batch_axis_names, field="batch_axis_names")
        unknown = [b for b in batch if b not in names]
        if unknown:
            default = " (the default)" if self.batch_axis_names == "data" else ""
            raise MeshConfigError(
                f"batch_axis_names={self.batch_axis_names!r}{default} names {unknown}, which are "
                f"not mesh axes; accepted: names from mesh_axis_names={names}"
            )
        if not isinstance(self.batch_axis_names, str):
            object.__setattr__(self, "batch_axis_names", batch)
        if self.mesh_rules is not None:
            object.__setattr__(self, "mesh_rules", _check_rules(self.mesh_rules, len(names)))

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data.

        Returns:
            JSON-ready data (lists, numbers, strings, None) that `from_dict` reads back.
        """
        batch = self.batch_axis_names
        return {
            "mesh_shape": _shape_to_data(self.mesh_shape),
            "mesh_axis_names": list(self.mesh_axis_names),
            "batch_axis_names": batch if isinstance(batch, str) else list(batch),
            "mesh_rules": None
            if self.mesh_rules is None
            else [[regex, _shape_to_data(value)] for regex, value in self.mesh_rules],
        }


def first_axis_shape(num_axes: int) -> MeshShape:
    """All devices on the first axis: `(-1, 1, ..., 1)`."""
    return (-1,) + (1,) * (num_axes - 1)


def _check_value(value: Any, *, field: str, num_axes: int) -> MeshShape | HybridMeshShape:
    shape = value if isinstance(value, HybridMeshShape) else check_shape(value, field=field)
    if len(shape) != num_axes:
        raise MeshConfigError(
            f"{field}={value!r} has {len(shape)} axes; accepted: {num_axes}, one per mesh axis"
        )
    return shape


def _check_names(value: Any, *, field: str) -> tuple[str, ...]:
    names = (value,) if isinstance(value, str) and field == "batch_axis_names" else value
    if not isinstance(names, tuple | list) or not names:
        raise MeshConfigError(f"{field}={value!r} is not a non-empty tuple of axis names")
    for name in names:
        if not isinstance(name, str) or not name:
            raise MeshConfigError(f"{field}={value!r} holds {name!r}; accepted: non-empty strings")
    if len(set(names)) != len(names):
        raise MeshConfigError(f"{field}={value!r} repeats a name; accepted: distinct names")
    return tuple(names)


def _check_rules(rules: Any, num_axes: int) -> tuple[tuple[str, ShapeValue], ...]:
    if not isinstance(rules, tuple | list):
        raise MeshConfigError(f"mesh_rules={rules!r} is not a tuple of (regex, shape) pairs")
    checked = []
    for i, rule in enumerate(rules):
        if not isinstance(rule, tuple | list) or len(rule) != 2:
            raise MeshConfigError(f"mesh_rules[{i}]={rule!r} is not a (regex, shape) pair")
        regex = check_regex(rule[0], field=f"mesh_rules[{i}][0]")
        value = (
            None
            if rule[1] is None
            else _check_value(rule[1], field=f"{rule_name(i, regex)}: shape", num_axes=num_axes)
        )
        checked.append((regex, value))
    return tuple(checked)


def rule_name(index: int, regex: Any) -> str:
    """How an error names a mesh rule: by the regex the user wrote, and its place."""
    return f"mesh rule {regex!r} (mesh_rules[{index}])"


# -- plain data ---------------------------------------------------------------------------------


def fields_from_data(data: Any) -> dict[str, Any]:
    """The keyword arguments of `ConfigFields` (and `MeshConfig`) from `to_dict` data or a TOML
    table; unknown keys are an error.

    A shape is a list, or a table with `ici_mesh_shape` and `dcn_mesh_shape`. A rule is a
    `[regex, shape]` pair or a table `{selector = regex, mesh_shape = shape}` (no mesh_shape:
    all devices on the first axis).
    """
    if not isinstance(data, dict):
        raise MeshConfigError(f"config data {data!r} is not a dict")
    no_unknown(data, KEYS, where="config")
    if "mesh_axis_names" not in data:
        raise MeshConfigError("config data has no mesh_axis_names; it is required")
    rules = data.get("mesh_rules")
    if isinstance(rules, list | tuple):
        rules = [_rule_from_data(rule, i) for i, rule in enumerate(rules)]
    return {
        "mesh_shape": _shape_from_data(data.get("mesh_shape"), field="mesh_shape"),
        "mesh_axis_names": data["mesh_axis_names"],
        "batch_axis_names": data.get("batch_axis_names", "data"),
        "mesh_rules": rules,
    }


def no_unknown(data: dict[str, Any], keys: Sequence[str], *, where: str) -> None:
    unknown = sorted(set(data) - set(keys))
    if unknown:
        raise MeshConfigError(f"{where} has unknown keys {unknown}; accepted: {list(keys)}")


def _shape_to_data(shape: ShapeValue) -> Any:
    if isinstance(shape, HybridMeshShape):
        return {
            "ici_mesh_shape": list(shape.ici_mesh_shape),
            "dcn_mesh_shape": list(shape.dcn_mesh_shape),
        }
    return None if shape is None else list(shape)


def _shape_from_data(value: Any, *, field: str) -> Any:
    if isinstance(value, dict):
        no_unknown(value, ("ici_mesh_shape", "dcn_mesh_shape"), where=field)
        if set(value) != {"ici_mesh_shape", "dcn_mesh_shape"}:
            raise MeshConfigError(f"{field}={value!r} needs ici_mesh_shape and dcn_mesh_shape")
        return HybridMeshShape(value["ici_mesh_shape"], value["dcn_mesh_shape"])
    return value


def _rule_from_data(rule: Any, i: int) -> Any:
    field = f"mesh_rules[{i}]"
    if isinstance(rule, dict):
        no_unknown(rule, ("selector", "mesh_shape"), where=field)
        if "selector" not in rule:
            raise MeshConfigError(f"{field}={rule!r} has no selector (the regex)")
        regex, shape = rule["selector"], rule.get("mesh_shape")
    elif isinstance(rule, list | tuple) and len(rule) == 2:
        regex, shape = rule
    else:
        return rule  # ConfigFields reports it
    try:
        return (regex, _shape_from_data(shape, field="shape"))
    except MeshConfigError as err:
        raise MeshConfigError(f"{rule_name(i, regex)}: {err}") from None
