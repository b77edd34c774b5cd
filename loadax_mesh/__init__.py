"""loadax_mesh: a JAX-native hybrid (ICI x DCN) device-mesh planner.

Every public name loads lazily (PEP 562), so planning for simulated hardware never imports jax.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from . import presets as _presets

__version__ = "0.1.0"

_PUBLIC = {
    "MeshConfigError": "errors",
    "MeshShape": "shapes",
    "HybridMeshShape": "shapes",
    "infer_mesh_shape": "shapes",
    "match_regex_rules": "rules",
    "MeshConfig": "config",
    "MeshPlan": "plan",
    "plan_mesh": "plan",
    "create_device_mesh": "plan",
    "simulate_devices": "hardware.strings",
    "detect_hardware": "hardware.detect",
    "load_catalogue": "hardware.loading",
    "list_presets": "presets",
    "shard_batch": "jobs.batch",
    "host_batch_slice": "jobs.batch",
    "HostBatchSlice": "jobs.batch",
    "replan": "jobs.replan",
    "Replan": "jobs.replan",
    "axis_groups": "groups",
    "process_groups": "groups",
    "submesh": "groups",
    "flatten_axes": "groups",
    "coordinate": "groups",
    "topology_devices": "hardware.topology",
    "ModelSpec": "workload.model",
    "TrainSpec": "workload.spec",
    "compile_step": "compiler.report",
    "CompileReport": "compiler.report",
    "estimate": "cost.estimate",
    "Estimate": "cost.estimate",
    "choose_mesh": "cost.choose.mesh",
    "Choice": "cost.choose.mesh",
}

__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:
    from .compiler.report import CompileReport, compile_step
    from .config import MeshConfig
    from .cost.choose.mesh import Choice, choose_mesh
    from .cost.estimate import Estimate, estimate
    from .errors import MeshConfigError
    from .groups import axis_groups, coordinate, flatten_axes, process_groups, submesh
    from .hardware.detect import detect_hardware
    from .hardware.loading import load_catalogue
    from .hardware.strings import simulate_devices
    from .hardware.topology import topology_devices
    from .jobs.batch import HostBatchSlice, host_batch_slice, shard_batch
    from .jobs.replan import Replan, replan
    from .plan import MeshPlan, create_device_mesh, plan_mesh
    from .presets import list_presets
    from .rules import match_regex_rules
    from .shapes import HybridMeshShape, MeshShape, infer_mesh_shape
    from .workload.model import ModelSpec
    from .workload.spec import TrainSpec


def _auto_preset(**options: Any) -> Any:
    """`MeshConfig.from_preset("auto", ...)`: the winner of `choose_mesh` (cost/choose/mesh.py)."""
    from .cost.choose.mesh import auto_preset

    return auto_preset(**options)


_presets.COMPUTED["auto"] = _auto_preset  # the core names no higher wing; its face does


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'loadax_mesh' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return [*__all__, "__version__"]
