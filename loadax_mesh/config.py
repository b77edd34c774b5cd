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

    Raises:
        MeshConfigError: when built with any invalid field; the message names it.
    """

    # -- choosing and planning ------------------------------------------------------------

    def select(self, selector: str) -> MeshConfig:
        """A copy whose mesh_shape is the first rule matching `selector` (else unchanged).

        Args:
            selector: a hardware string such as "tpu-v5p-512", matched with `re.fullmatch`.

        Returns:
            This config when no rule matches; else a copy with that rule's shape.

        Raises:
            MeshConfigError: `selector` is not a string.
        """
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
        """Plan over `devices`: the shape resolved, split into ICI and DCN, the devices ordered.

        Args:
            devices: the devices to plan over (default `jax.devices()`); simulated ones
                (`simulate_devices`) plan without importing jax.
            selector: the hardware string the rules match; by default detected from the devices
                (`detect_hardware`) when the config has `mesh_rules`.
            granule: what one ICI domain is: "auto", "slice", "process", "none" or a callable
                device -> key.

        Returns:
            The `MeshPlan`.

        Raises:
            MeshConfigError: the shape does not use exactly the devices given, granules differ in
                size, or `selector` or `granule` is bad; a failing rule's shape names the rule.
        """
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
        """The planned `jax.sharding.Mesh`: `plan(...)`, then `MeshPlan.to_jax_mesh(axis_types)`.

        Args:
            devices: as for `plan` (default `jax.devices()`).
            selector: as for `plan`.
            granule: as for `plan`.
            axis_types: None, or one `jax.sharding.AxisType` per axis.

        Returns:
            The Mesh over the planned device order.

        Raises:
            MeshConfigError: as `plan`; also for simulated devices or bad `axis_types`.
        """
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
        """The PartitionSpec of a batch's leading dimension.

        Returns:
            `P("data")` for one batch axis, `P(("data", "fsdp"))` for several, in mesh order.
        """
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
        global_batch=..., axes=..., **options)` (`options`: TrainSpec fields; the recipe
        fields among them, `remat`, `microbatches`, `logits_chunks`, `moe`,
        `pipeline_microbatches` and `pipeline_repeats`, pin the search) is the winner of
        `choose_mesh`: its mesh only. The recipe it won with is that winner's `train`, from
        the same search::

            ranking = choose_mesh(hardware, model, TrainSpec(global_batch=..., **options),
                                  axes=axes, recipes=[pinned])  # pinned: the recipe options
            ranking[0].config  # this config
            ranking[0].train   # its recipe: run the step with this TrainSpec
            print(ranking)     # the ranking, as `loadax-mesh plan --strategy auto` prints it

        (with no recipe option given, `recipes` may be left out: the whole search). A step
        run with other fields runs another recipe than the one that won.

        Args:
            name: a name of `list_presets()`, or "auto".
            **overrides: axis sizes by the preset's keywords or axis names (`tp=8` or `model=8`),
                fixed everywhere while the rest axis absorbs the difference; for "auto",
                `hardware`, `model`, `global_batch` and TrainSpec options.

        Returns:
            The `MeshConfig`, with the preset's mesh rules.

        Raises:
            MeshConfigError: an unknown preset or override, or a size the preset cannot hold; for
                "auto", a missing or unknown option, or no mesh that fits.
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
        """Read `to_dict` data (or a TOML table) back into a config.

        Args:
            data: a mapping with the keys of `to_dict` (`fields_from_data` says which forms
                shapes and rules take).

        Returns:
            The `MeshConfig`.

        Raises:
            MeshConfigError: an unknown key or an invalid value.
        """
        return cls(**fields_from_data(data))

    @classmethod
    def from_toml(cls, path: str | Path) -> MeshConfig:
        """Read a config from a TOML file with the keys of `to_dict`.

        Args:
            path: the TOML file.

        Returns:
            The `MeshConfig`.

        Raises:
            MeshConfigError: the file is unreadable or no TOML, or its data invalid.
        """
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
