"""MeshPlan: the planner's answer, and the functions that compute it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .config_data import ConfigFields
from .errors import MeshConfigError
from .hardware.devices import DeviceTable, GranuleSpec, SimulatedDevice, granule_keys, read_devices
from .hardware.profile import HardwareProfile, hardware_profile
from .quality import AxisQuality, axis_quality
from .shapes import HybridMeshShape, MeshShape, check_shape, resolve_hybrid, split_mesh_shape
from .solver.hybrid import Layout, granule_sizes, layout_devices

if TYPE_CHECKING:
    import jax

    from .export.axlearn import AXLearnConfig
    from .export.maxtext import MaxTextConfig
    from .workload.spec import ModelSpec, TrainSpec


@dataclass(frozen=True, eq=False)
class MeshPlan:
    """A device grid with its ICI/DCN split, ready to become a `jax.sharding.Mesh`."""

    axis_names: tuple[str, ...]
    ici_mesh_shape: tuple[int, ...]
    dcn_mesh_shape: tuple[int, ...]
    devices: np.ndarray = field(repr=False)  # object array of devices, shaped like the mesh
    granule_kind: str  # "slice", "process", "none" or "custom"
    selector: str | None  # the hardware string the caller or the device set gave, if any
    batch_axis_names: tuple[str, ...]
    layout: Layout = field(repr=False)
    table: DeviceTable = field(repr=False)

    @property
    def shape(self) -> dict[str, int]:
        """Axis name -> size."""
        return dict(zip(self.axis_names, self.devices.shape, strict=True))

    @cached_property
    def hardware(self) -> str:
        """The hardware string: the one given, else the name the devices' table gets from the
        catalogue or, where it lists no such set, their generic selector. Named only when asked:
        planning does not pay for it."""
        if self.selector is not None:
            return self.selector
        from .hardware.detect import name_devices

        return name_devices(self.table)

    @property
    def profile(self) -> HardwareProfile:
        """The hardware string resolved against the catalogue (a MeshConfigError where it names
        no catalogue hardware)."""
        return hardware_profile(self.hardware)

    @property
    def num_granules(self) -> int:
        return self.layout.num_granules

    @property
    def data_parallel_size(self) -> int:
        """The product of the batch axes' sizes: how many distinct batch shards there are."""
        return math.prod(self.shape[a] for a in self.batch_axis_names)

    def to_jax_mesh(self, axis_types: Sequence[Any] | None = None) -> jax.sharding.Mesh:
        """The plan as a `jax.sharding.Mesh`.

        Args:
            axis_types: None, or one `jax.sharding.AxisType` per axis.

        Returns:
            The Mesh over the plan's device array and axis names.

        Raises:
            MeshConfigError: the plan is over simulated devices (a Mesh needs real jax devices),
                or `axis_types` is not one AxisType per axis.
        """
        import jax

        if isinstance(self.devices.flat[0], SimulatedDevice):
            raise MeshConfigError(
                f"devices: this plan is over simulated devices ({self.hardware}), "
                "which cannot form a jax Mesh; accepted: real jax devices (plan with devices=None "
                "or jax.devices())"
            )
        if axis_types is not None:
            types = tuple(axis_types) if isinstance(axis_types, list | tuple) else None
            if (
                types is None
                or len(types) != len(self.axis_names)
                or not all(isinstance(t, jax.sharding.AxisType) for t in types)
            ):
                raise MeshConfigError(
                    f"axis_types={axis_types!r}; accepted: None or a tuple of "
                    f"{len(self.axis_names)} jax.sharding.AxisType values"
                )
            return jax.sharding.Mesh(self.devices, self.axis_names, axis_types=types)
        return jax.sharding.Mesh(self.devices, self.axis_names)

    @cached_property
    def _quality(self) -> dict[str, AxisQuality]:
        return axis_quality(self.layout, self.table.coords, self.axis_names, self.dcn_mesh_shape)

    def quality(self) -> dict[str, AxisQuality]:
        """How good the layout is, per axis (docs/design.md section 5).

        Returns:
            Axis name -> `AxisQuality`: ICI ring steps, hops, efficiency and DCN crossings.
        """
        return dict(self._quality)

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain data.

        Returns:
            JSON-ready data: the attributes by name, `devices` as nested lists of device ids, and
            `quality` per axis.
        """
        return {
            "axis_names": list(self.axis_names),
            "ici_mesh_shape": list(self.ici_mesh_shape),
            "dcn_mesh_shape": list(self.dcn_mesh_shape),
            "shape": self.shape,
            "devices": self.table.ids[self.layout.index].tolist(),
            "granule_kind": self.granule_kind,
            "hardware": self.hardware,
            "batch_axis_names": list(self.batch_axis_names),
            "quality": {name: q.to_dict() for name, q in self._quality.items()},
        }

    def to_maxtext(
        self, train: TrainSpec, *, model: ModelSpec | str | None = None, order: bool = True
    ) -> MaxTextConfig:
        """MaxText's config keys for this plan and `train`'s recipe, with what does not travel.

        Args:
            train: the batch, dtypes and recipe.
            model: the model (a ModelSpec or a catalogue name), for `model_name` and the
                sequence length (optional).
            order: also judge the device order MaxText builds with jax's `mesh_utils` (imports jax).

        Returns:
            A `MaxTextConfig`: the `key=value` settings and notes on what is lost or approximate.

        Raises:
            MeshConfigError: what MaxText cannot express (an axis with no MaxText role, two
                data-parallel axes, a tensor or sequence axis that splits the batch, ...).
        """
        from .export.maxtext import to_maxtext  # a facade: the export lives in export/

        return to_maxtext(self, train, model=model, order=order)

    def to_axlearn(self, *, order: bool = True, quantization: str = "none") -> AXLearnConfig:
        """AXLearn's `mesh_shape` and `mesh_rules` entry for this plan, as Python text and values.

        Args:
            order: also judge the device order AXLearn builds with jax's `mesh_utils` (imports jax).
            quantization: the recipe's precision (`TrainSpec.quantization`): no AXLearn mesh
                field carries it, a note says so.

        Returns:
            An `AXLearnConfig` over AXLearn's six standard axes.

        Raises:
            MeshConfigError: a batch axis maps to AXLearn's model or pipeline axis.
        """
        from .export.axlearn import to_axlearn  # a facade: the export lives in export/

        return to_axlearn(self, order=order, quantization=quantization)

    def to_flax_rules(self) -> tuple[tuple[str, str | tuple[str, ...] | None], ...]:
        """Flax logical axis rules onto this plan's axes, for use with this plan's own Mesh.

        Returns:
            (logical axis, mesh axis or axes or None) pairs for batch, length, embed, heads,
            kv_heads, kv, mlp, vocab, exp, embed_no_exp and stage (the stage dim of pipelined
            weights): the argument of `flax.linen.logical_axis_rules`.
        """
        from .export.flax_rules import to_flax_rules  # a facade: the export lives in export/

        return to_flax_rules(self)

    def describe(self) -> str:
        """The plan as text.

        Returns:
            What `loadax-mesh plan` prints: hardware, axes with ring quality, batch, device grid.
        """
        from .view.report import render_text  # a facade: the text lives in view/

        return render_text(self)


def _generic_names(n: int) -> tuple[str, ...]:
    return tuple(f"axis{i}" for i in range(n))


def plan_mesh(
    mesh_shape: MeshShape | HybridMeshShape | Sequence[int],
    devices: Sequence[Any] | None = None,
    *,
    axis_names: Sequence[str],
    batch_axis_names: str | Sequence[str] = "data",
    granule: GranuleSpec = "auto",
    hardware: str | None = None,
) -> MeshPlan:
    """Plan a mesh of `mesh_shape` over `devices`, without a `MeshConfig`.

    Args:
        mesh_shape: a shape (one entry may be -1) or a `HybridMeshShape`.
        devices: the devices (default `jax.devices()`).
        axis_names: one name per axis.
        batch_axis_names: the batch axis or axes.
        granule: as for `MeshConfig.plan`.
        hardware: the hardware string the plan names (default: from the devices).

    Returns:
        The `MeshPlan`.

    Raises:
        MeshConfigError: an invalid shape or names, or a shape that does not use exactly the
            devices given.
    """
    shape, names, batch = cast(Any, (mesh_shape, axis_names, batch_axis_names))
    config = ConfigFields(shape, names, batch)  # validates and converts lists to tuples
    return plan_config(config, devices, granule=granule, hardware=hardware)


def create_device_mesh(
    mesh_shape: MeshShape | HybridMeshShape | Sequence[int],
    devices: Sequence[Any] | None = None,
    *,
    granule: GranuleSpec = "auto",
) -> np.ndarray:
    """The device array alone, as `mesh_utils.create_device_mesh` and AXLearn return it.

    Args:
        mesh_shape: a shape (one entry may be -1) or a `HybridMeshShape`.
        devices: the devices (default `jax.devices()`).
        granule: as for `MeshConfig.plan`.

    Returns:
        A numpy object array of the devices, shaped like the mesh, in the planned order.

    Raises:
        MeshConfigError: an invalid shape, or one that does not use exactly the devices given.
    """
    shape = (
        mesh_shape
        if isinstance(mesh_shape, HybridMeshShape)
        else check_shape(mesh_shape, field="mesh_shape")
    )
    names = _generic_names(len(shape))
    return plan_mesh(
        shape, devices, axis_names=names, batch_axis_names=names[0], granule=granule
    ).devices


def plan_config(
    config: ConfigFields,
    devices: Sequence[Any] | None,
    *,
    granule: GranuleSpec,
    hardware: str | None,
) -> MeshPlan:
    """Plan `config`'s own shape (its rules already applied) over `devices`."""
    if devices is None:
        import jax

        devices = jax.devices()
    table = read_devices(devices)
    granule_ids, kind = granule_keys(table, granule)
    num_granules, per_granule = granule_sizes(granule_ids)
    shape = config.mesh_shape
    assert shape is not None  # ConfigFields fills it in
    if isinstance(shape, HybridMeshShape):
        hybrid = resolve_hybrid(shape, num_granules=num_granules, granule_size=per_granule)
    else:
        hybrid = split_mesh_shape(shape, num_devices=len(table), num_granules=num_granules)
    layout = layout_devices(table, granule_ids, hybrid)
    batch = config.batch_axis_names
    return MeshPlan(
        axis_names=config.mesh_axis_names,
        ici_mesh_shape=hybrid.ici_mesh_shape,
        dcn_mesh_shape=hybrid.dcn_mesh_shape,
        devices=table.devices[layout.index],
        granule_kind=kind,
        selector=hardware or getattr(devices, "hardware", None),  # simulated sets name it
        batch_axis_names=(batch,) if isinstance(batch, str) else tuple(batch),
        layout=layout,
        table=table,
    )
