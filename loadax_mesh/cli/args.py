"""The command line's shared pieces: the error it reports, the flags that describe a mesh,
and turning them into a MeshConfig and a plan (with the planner's warnings as notes)."""

from __future__ import annotations

import argparse
import logging
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import MeshConfig
    from ..plan import MeshPlan


class UsageError(Exception):
    """A command line argparse rejects; reported like a MeshConfigError."""


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Let shapes such as `-1,8` be values, not options (argparse only allows `-1`).
        self._negative_number_matcher = re.compile(r"^-\d[-\d,. ]*$")

    def error(self, message: str) -> Any:  # argparse would print usage and exit
        raise UsageError(message)


def positive_int(text: str) -> int:
    if not re.fullmatch(r"[0-9]+", text) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def non_negative_int(text: str) -> int:
    if not re.fullmatch(r"[0-9]+", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative integer")
    return int(text)


PLAN_FLAGS: dict[str, tuple[dict[str, Any], str]] = {  # flag: (argparse options, help)
    "--devices": (
        {"choices": ["local", "aot", "libtpu"]},
        "local: this machine's jax.devices(), not HARDWARE; aot: HARDWARE's real devices from "
        "the compile-only client (libtpu for TPU, XLA's CUDA client for GPU; default for "
        "compile); libtpu: the same, TPU strings only",
    ),
    "--strategy": (
        {"metavar": "PRESET"},
        "a preset (`loadax-mesh presets`), whose rules pick the shape, or auto: the cost model "
        "chooses it (with --model and --global-batch)",
    ),
    "--set": (
        {"dest": "overrides", "action": "append", "default": [], "metavar": "AXIS=SIZE"},
        "override a preset axis size, e.g. tp=8 (repeatable)",
    ),
    "--shape": ({}, "mesh shape such as 16,16 or -1,8 (no rules); the ICI part with --dcn-shape"),
    "--dcn-shape": ({}, "the DCN part of a hybrid shape, e.g. 4,1"),
    "--axes": ({}, "axis names for --shape, e.g. data,model"),
    "--batch-axes": (
        {},
        "batch axes, e.g. data,fsdp (default: the preset's, else the first axis that is not a "
        "pipeline axis)",
    ),
    "--granule": (
        {"default": "auto", "choices": ["auto", "slice", "process", "none"]},
        "what one ICI island is (default: auto)",
    ),
    "--global-batch": (
        {"type": positive_int, "metavar": "N"},
        "sequences per step over the whole job (plan: also the rows each host loads)",
    ),
}
PICTURE_FLAGS: dict[str, tuple[dict[str, Any], str]] = {  # plan's only
    "--svg": ({"metavar": "FILE"}, "also write the device grid picture as SVG"),
    "--color": (
        {"default": "auto", "choices": ["auto", "always", "never"]},
        "ANSI colours in the grid (auto: when stdout is a terminal)",
    ),
}


def config_from_args(args: argparse.Namespace, selector: str) -> tuple[MeshConfig, str]:
    """The MeshConfig the flags describe, and a sentence saying where its shape comes from."""
    from ..config import MeshConfig
    from ..shapes import HybridMeshShape
    from ..view.picture import shape_text

    if args.shape is None:
        for flag in ("dcn_shape", "axes"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} needs --shape")
    if args.strategy is None:
        if args.shape is None:
            raise UsageError(
                f"{args.command} needs --strategy (one of {_strategy_names()}) or --shape with "
                "--axes"
            )
        if args.axes is None:
            raise UsageError("--shape needs --axes (or a --strategy whose axes it uses)")
        if args.overrides:
            raise UsageError("--set needs --strategy")
    preset = None
    if args.strategy is not None:
        preset = MeshConfig.from_preset(args.strategy, **_overrides(args.overrides))
    if args.axes is not None:
        axes = _names(args.axes, "--axes")
    else:
        assert preset is not None
        axes = preset.mesh_axis_names
    batch: Any = (
        _names(args.batch_axes, "--batch-axes")
        if args.batch_axes
        else preset.batch_axis_names
        if preset is not None
        else _first_batch_axis(axes)
    )
    if args.shape is not None:
        shape: Any = _ints(args.shape, "--shape")
        if args.dcn_shape is not None:
            shape = HybridMeshShape(shape, _ints(args.dcn_shape, "--dcn-shape"))
        config = MeshConfig(shape, axes, batch)
        return config, f"shape {shape_text(config.mesh_shape)} from --shape"
    assert preset is not None
    config = MeshConfig(preset.mesh_shape, axes, batch, preset.mesh_rules)
    rules = config.mesh_rules or ()
    for regex, _value in rules:
        if re.fullmatch(regex, selector):
            return config, (
                f"preset {args.strategy}: rule '{regex}' matches {selector}, shape "
                f"{shape_text(config.select(selector).mesh_shape)}"
            )
    return config, (
        f"preset {args.strategy}: none of its {len(rules)} mesh rules matches "
        f"{selector}, so its default shape {shape_text(config.mesh_shape)} is used"
    )


def plan_with_notes(
    config: MeshConfig, devices: list[Any], selector: str, granule: str, notes: list[str]
) -> MeshPlan:
    """Plan, turning the planner's logged warnings into notes of the report."""
    logger = logging.getLogger("loadax_mesh")

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            notes.append(record.getMessage().removeprefix("loadax_mesh: "))

    handler, propagate = Collect(logging.WARNING), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        return config.plan(devices, selector=selector, granule=granule)
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _ints(text: str, flag: str) -> tuple[int, ...]:
    parts = text.strip().split(",")
    for part in parts:
        if not re.fullmatch(r"-?[0-9]+", part.strip()):
            raise UsageError(
                f"{flag}={text!r}: {part!r} is not an integer; accepted: integers "
                "separated by commas, such as 16,16 or -1,8"
            )
    return tuple(int(p) for p in parts)


def _names(text: str, flag: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(","))
    if not all(names):
        raise UsageError(
            f"{flag}={text!r} holds an empty name; accepted: names separated by "
            "commas, such as data,model"
        )
    return names


def _overrides(items: list[str]) -> dict[str, int]:
    result = {}
    for item in items:
        match = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(-?[0-9]+)\s*", item)
        if match is None:
            raise UsageError(f"--set {item!r}; accepted: AXIS=SIZE with SIZE an integer, e.g. tp=8")
        result[match[1]] = int(match[2])
    return result


def print_json(data: Any) -> None:
    import json

    print(json.dumps(data, indent=1))


def _strategy_names() -> str:
    from ..presets import strategy_names

    return ", ".join(strategy_names())


def _first_batch_axis(axes: tuple[str, ...]) -> str:
    """The default batch axis of --axes: the first that is not a pipeline axis (a pipeline's
    stages run the layers one after another, never on parts of the batch)."""
    from ..workload.layout import PIPELINE_NAMES

    return next((a for a in axes if a not in PIPELINE_NAMES), axes[0])
