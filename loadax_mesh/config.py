"""MeshConfig: what a user writes (axes, a shape with one -1, batch axes, mesh rules)."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .devices import GranuleSpec
from .errors import MeshConfigError
from .rules import check_regex, match_regex_rules
from .shapes import HybridMeshShape, MeshShape, check_shape

if TYPE_CHECKING:
    import jax

    from .plan import MeshPlan

ShapeValue = MeshShape | HybridMeshShape | None
_KEYS = ("mesh_shape", "mesh_axis_names", "batch_axis_names", "mesh_rules")


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


@dataclass(frozen=True)
class MeshConfig:
    """A mesh as a user describes it; validated when built, hashable, JSON/TOML round-trips.

    `mesh_shape=None` (and a rule value of None) means all devices on the first axis.
    """

    mesh_shape: MeshShape | HybridMeshShape | None
    mesh_axis_names: tuple[str, ...]
    batch_axis_names: str | tuple[str, ...] = "data"
    mesh_rules: tuple[tuple[str, ShapeValue], ...] | None = None

    def __post_init__(self) -> None:
        names = _check_names(self.mesh_axis_names, field="mesh_axis_names")
        object.__setattr__(self, "mesh_axis_names", names)
        shape = self.mesh_shape
        shape = (
            self._first_axis_shape()
            if shape is None
            else _check_value(shape, field="mesh_shape", num_axes=len(names))
        )
        object.__setattr__(self, "mesh_shape", shape)
        batch = _check_names(self.batch_axis_names, field="batch_axis_names")
        unknown = [b for b in batch if b not in names]
        if unknown:
            raise MeshConfigError(
                f"batch_axis_names={self.batch_axis_names!r} names {unknown}, which are not mesh "
                f"axes; accepted: names from mesh_axis_names={names}"
            )
        if not isinstance(self.batch_axis_names, str):
            object.__setattr__(self, "batch_axis_names", batch)
        if self.mesh_rules is not None:
            object.__setattr__(self, "mesh_rules", self._check_rules(self.mesh_rules))

    def _first_axis_shape(self) -> MeshShape:
        return (-1,) + (1,) * (len(self.mesh_axis_names) - 1)

    def _check_rules(self, rules: Any) -> tuple[tuple[str, ShapeValue], ...]:
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
                else _check_value(
                    rule[1], field=f"mesh_rules[{i}][1]", num_axes=len(self.mesh_axis_names)
                )
            )
            checked.append((regex, value))
        return tuple(checked)

    # -- choosing and planning ------------------------------------------------------------

    def select(self, selector: str) -> MeshConfig:
        """A copy whose mesh_shape is the first rule matching `selector` (else unchanged)."""
        missing = object()
        value = match_regex_rules(selector, self.mesh_rules or (), default=missing)
        if value is missing:
            return self
        shape = self._first_axis_shape() if value is None else value
        return MeshConfig(shape, self.mesh_axis_names, self.batch_axis_names, self.mesh_rules)

    def plan(
        self,
        devices: Sequence[Any] | None = None,
        *,
        selector: str | None = None,
        granule: GranuleSpec = "auto",
    ) -> MeshPlan:
        """Plan over `devices` (default `jax.devices()`); rules pick the shape by `selector`,
        detected from the devices when not given."""
        from .plan import _plan

        if selector is not None and not isinstance(selector, str):
            raise MeshConfigError(f"selector={selector!r} is not a string such as 'tpu-v5p-512'")
        if devices is None:
            import jax

            devices = jax.devices()
        config = self
        if self.mesh_rules:
            if selector is None:
                from .detect import detect_hardware

                selector = detect_hardware(devices)
            config = self.select(selector)
        return _plan(config, devices, granule=granule, hardware=selector)

    def create_device_mesh(
        self,
        devices: Sequence[Any] | None = None,
        *,
        selector: str | None = None,
        granule: GranuleSpec = "auto",
        axis_types: Sequence[Any] | None = None,
    ) -> jax.sharding.Mesh:
        """The planned `jax.sharding.Mesh`."""
        return self.plan(devices, selector=selector, granule=granule).to_jax_mesh(axis_types)

    @property
    def hosts(self) -> int:
        """The number of processes in this job (`jax.process_count()`)."""
        import jax

        return jax.process_count()

    @property
    def host_id(self) -> int:
        """This process's index (`jax.process_index()`)."""
        import jax

        return jax.process_index()

    def batch_partition_spec(self) -> jax.sharding.PartitionSpec:
        """`P("data")` for one batch axis, `P(("data", "fsdp"))` for several, in mesh order."""
        from jax.sharding import PartitionSpec

        batch = (
            (self.batch_axis_names,)
            if isinstance(self.batch_axis_names, str)
            else (self.batch_axis_names)
        )
        ordered = tuple(a for a in self.mesh_axis_names if a in batch)
        return PartitionSpec(ordered[0] if len(ordered) == 1 else ordered)

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> MeshConfig:
        """A strategy preset (`dp`, `fsdp`, `hsdp`, ...) with optional axis-size overrides."""
        from .presets import load_preset

        return load_preset(name, **overrides)

    # -- plain data -----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (lists, numbers, strings, None) that `from_dict` reads back."""
        batch = self.batch_axis_names
        return {
            "mesh_shape": _shape_to_data(self.mesh_shape),
            "mesh_axis_names": list(self.mesh_axis_names),
            "batch_axis_names": batch if isinstance(batch, str) else list(batch),
            "mesh_rules": None
            if self.mesh_rules is None
            else [[regex, _shape_to_data(value)] for regex, value in self.mesh_rules],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MeshConfig:
        """Read `to_dict` data (or a TOML table); unknown keys are an error.

        A shape is a list, or a table with `ici_mesh_shape` and `dcn_mesh_shape`. A rule is a
        `[regex, shape]` pair or a table `{selector = regex, mesh_shape = shape}` (no
        mesh_shape: all devices on the first axis).
        """
        if not isinstance(data, dict):
            raise MeshConfigError(f"config data {data!r} is not a dict")
        _no_unknown(data, _KEYS, where="config")
        if "mesh_axis_names" not in data:
            raise MeshConfigError("config data has no mesh_axis_names; it is required")
        rules = data.get("mesh_rules")
        if isinstance(rules, list | tuple):
            rules = [_rule_from_data(rule, i) for i, rule in enumerate(rules)]
        return cls(
            mesh_shape=_shape_from_data(data.get("mesh_shape"), field="mesh_shape"),
            mesh_axis_names=data["mesh_axis_names"],
            batch_axis_names=data.get("batch_axis_names", "data"),
            mesh_rules=rules,  # type: ignore[arg-type]  # MeshConfig checks it
        )

    @classmethod
    def from_toml(cls, path: str | Path) -> MeshConfig:
        """Read a config from a TOML file with the keys of `to_dict`."""
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise MeshConfigError(f"path={str(path)!r} is no readable TOML file: {err}") from None
        return cls.from_dict(data)


def _no_unknown(data: dict[str, Any], keys: Sequence[str], *, where: str) -> None:
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
        _no_unknown(value, ("ici_mesh_shape", "dcn_mesh_shape"), where=field)
        if set(value) != {"ici_mesh_shape", "dcn_mesh_shape"}:
            raise MeshConfigError(f"{field}={value!r} needs ici_mesh_shape and dcn_mesh_shape")
        return HybridMeshShape(value["ici_mesh_shape"], value["dcn_mesh_shape"])
    return value


def _rule_from_data(rule: Any, i: int) -> Any:
    field = f"mesh_rules[{i}]"
    if isinstance(rule, dict):
        _no_unknown(rule, ("selector", "mesh_shape"), where=field)
        if "selector" not in rule:
            raise MeshConfigError(f"{field}={rule!r} has no selector (the regex)")
        return (rule["selector"], _shape_from_data(rule.get("mesh_shape"), field=field))
    if isinstance(rule, list | tuple) and len(rule) == 2:
        return (rule[0], _shape_from_data(rule[1], field=field))
    return rule  # MeshConfig reports it
