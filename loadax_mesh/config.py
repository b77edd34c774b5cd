"""MeshConfig: what a user writes (axes, a shape with one -1, batch axes, mesh rules)."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config_data import ConfigFields, fields_from_data, rule_name
from .errors import MeshConfigError
from .hardware.detect import detect_hardware
from .hardware.devices import GranuleSpec
from .plan import MeshPlan, plan_config
from .presets import COMPUTED, load_preset
from .rules import match_regex_rules

if TYPE_CHECKING:
    import jax


@dataclass(frozen=True)
class MeshConfig(ConfigFields):
    """A mesh as a user describes it; validated when built, hashable, JSON/TOML round-trips.

    Fields (checked by `ConfigFields`): `mesh_shape`, `mesh_axis_names`, `batch_axis_names`
    (default "data"), `mesh_rules`. `mesh_shape=None` (and a rule value of None) means all
    devices on the first axis.
    """

    # -- choosing and planning ------------------------------------------------------------

    def select(self, selector: str) -> MeshConfig:
        """A copy whose mesh_shape is the first rule matching `selector` (else unchanged)."""
        index = self._rule_index(_check_selector(selector))
        if index is None:
            return self
        shape = (self.mesh_rules or ())[index][1]  # None: all devices on the first axis
        return MeshConfig(shape, self.mesh_axis_names, self.batch_axis_names, self.mesh_rules)

    def _rule_index(self, selector: str) -> int | None:
        """The index of the first rule matching `selector`, None when none does."""
        rules = self.mesh_rules or ()
        return match_regex_rules(selector, [(regex, i) for i, (regex, _) in enumerate(rules)])

    def plan(
        self,
        devices: Sequence[Any] | None = None,
        *,
        selector: str | None = None,
        granule: GranuleSpec = "auto",
    ) -> MeshPlan:
        """Plan over `devices` (default `jax.devices()`); rules pick the shape by `selector`,
        detected from the devices when not given."""
        if selector is not None:
            _check_selector(selector)
        if devices is None:
            import jax

            devices = jax.devices()
        if not self.mesh_rules:
            return plan_config(self, devices, granule=granule, hardware=selector)
        if selector is None:
            selector = detect_hardware(devices)
        index = self._rule_index(selector)
        try:
            return plan_config(self.select(selector), devices, granule=granule, hardware=selector)
        except MeshConfigError as err:
            if index is None:
                raise
            rule = rule_name(index, self.mesh_rules[index][0])
            raise MeshConfigError(f"{rule} matched {selector!r}: {err}") from None

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
        """A strategy preset (`dp`, `fsdp`, `hsdp`, ...) with optional axis-size overrides.

        `"auto"` computes the mesh instead: `from_preset("auto", hardware=..., model=...,
        global_batch=...)` (and optionally `remat`, `attention`, `axes`) is the winner of
        `choose_mesh`.
        """
        computed = COMPUTED.get(name)  # "auto": the cost model's choice
        if computed is not None:
            return computed(**overrides)
        fields = load_preset(name, **overrides)
        return cls(
            fields.mesh_shape, fields.mesh_axis_names, fields.batch_axis_names, fields.mesh_rules
        )

    # -- plain data -----------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MeshConfig:
        """Read `to_dict` data (or a TOML table); unknown keys are an error (`fields_from_data`
        says which forms shapes and rules take)."""
        return cls(**fields_from_data(data))

    @classmethod
    def from_toml(cls, path: str | Path) -> MeshConfig:
        """Read a config from a TOML file with the keys of `to_dict`."""
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise MeshConfigError(f"path={str(path)!r} is no readable TOML file: {err}") from None
        return cls.from_dict(data)


def _check_selector(selector: Any) -> str:
    """`selector` if it is a non-empty string, else a MeshConfigError naming it."""
    if not isinstance(selector, str) or not selector:
        raise MeshConfigError(
            f"selector={selector!r}; accepted: a non-empty hardware string such as 'tpu-v5p-512' "
            "or 'gpu-nvidia-h100-80gb-hbm3-4' (or None: detected from the devices)"
        )
    return selector
