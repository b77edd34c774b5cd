"""`loadax-mesh`: plan device meshes from the command line.

`loadax-mesh plan tpu-v5p-512 --strategy fsdp` plans for simulated hardware through the pure core
and the catalogue, without importing jax; only `--devices local`, `devices` and `launch` touch
jax. Bad input prints one line, `loadax-mesh: error: ...`, and exits with code 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .errors import MeshConfigError

if TYPE_CHECKING:
    from .config import MeshConfig
    from .plan import MeshPlan

PROG = "loadax-mesh"
MAX_DEVICE_LINES = 64


class UsageError(Exception):
    """A command line argparse rejects; reported like a MeshConfigError."""


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Let shapes such as `-1,8` be values, not options (argparse only allows `-1`).
        self._negative_number_matcher = re.compile(r"^-\d[-\d,. ]*$")

    def error(self, message: str) -> Any:  # argparse would print usage and exit
        raise UsageError(message)


def _positive_int(text: str) -> int:
    if not re.fullmatch(r"[0-9]+", text) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


_PLAN_HELP: dict[str, tuple[dict[str, Any], str]] = {  # flag: (argparse options, help)
    "--devices": (
        {"choices": ["local", "aot", "libtpu"]},
        "local: this machine's jax.devices(), not HARDWARE; aot: HARDWARE's real devices from "
        "the compile-only client (libtpu for TPU, XLA's CUDA client for GPU; default for "
        "compile); libtpu: the same, TPU strings only",
    ),
    "--strategy": (
        {"metavar": "PRESET"},
        "a preset (`loadax-mesh presets`); its rules pick the shape",
    ),
    "--set": (
        {"dest": "overrides", "action": "append", "default": [], "metavar": "AXIS=SIZE"},
        "override a preset axis size, e.g. tp=8 (repeatable)",
    ),
    "--shape": ({}, "mesh shape such as 16,16 or -1,8 (no rules); the ICI part with --dcn-shape"),
    "--dcn-shape": ({}, "the DCN part of a hybrid shape, e.g. 4,1"),
    "--axes": ({}, "axis names for --shape, e.g. data,model"),
    "--batch-axes": ({}, "batch axes, e.g. data,fsdp (default: the preset's, else the first)"),
    "--granule": (
        {"default": "auto", "choices": ["auto", "slice", "process", "none"]},
        "what one ICI island is (default: auto)",
    ),
    "--global-batch": (
        {"type": _positive_int, "metavar": "N"},
        "show the rows of an N-row global batch each host loads",
    ),
    "--svg": ({"metavar": "FILE"}, "also write the device grid picture as SVG"),
    "--color": (
        {"default": "auto", "choices": ["auto", "always", "never"]},
        "ANSI colours in the grid (auto: when stdout is a terminal)",
    ),
}
_COMMANDS = {
    "plan": "plan a mesh for a hardware string (simulated; jax is not imported) or for "
    "--devices local",
    "hardware": "the hardware catalogue",
    "presets": "the strategy presets: axes, batch axes, mesh rules",
    "devices": "what jax.devices() holds here, and the detected hardware string",
    "compile": "compile the reference training step for a plan (the real TPU or GPU compiler "
    "for a TPU or GPU string, no accelerator needed; or --devices local) and report memory, "
    "fit, FLOPs and collectives",
    "models": "the model catalogue for compile and the cost model",
    "launch": "N local processes joined by jax.distributed: launch --nprocs N "
    "--devices-per-process K -- CMD ...",
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Plan JAX device meshes over ICI and DCN.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    runs = dict(
        plan=_cmd_plan,
        hardware=_cmd_hardware,
        presets=_cmd_presets,
        devices=_cmd_devices,
        compile=_cmd_compile,
        models=_cmd_models,
    )
    for name, text in _COMMANDS.items():
        command = sub.add_parser(name, help=text, description=text, add_help=name != "launch")
        if name in runs:
            command.set_defaults(run=runs[name])
            command.add_argument("--format", default="text", choices=["text", "json"])
    from .cli_compile import COMPILE_FLAGS

    for name, extra in (("plan", {}), ("compile", COMPILE_FLAGS)):
        command = sub.choices[name]
        command.add_argument(
            "hardware",
            nargs="?",
            metavar="HARDWARE",
            help="e.g. tpu-v5p-512, "
            "tpu-v5litepod-256-4, gpu-p5.48xlarge-256, cpu-2x4 (`loadax-mesh hardware`)",
        )
        for flag, (options, text) in {**_PLAN_HELP, **extra}.items():
            if not (name == "compile" and flag in ("--global-batch", "--svg", "--color")):
                command.add_argument(flag, **options, help=text)
        if name == "compile":
            command.add_argument("--global-batch", **extra["--global-batch"][0])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 fine, 2 bad input)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        if args_list[:1] == ["launch"]:
            from .launcher import main as launch

            return launch(args_list[1:])
        args = build_parser().parse_args(args_list)
        return int(args.run(args))
    except (UsageError, MeshConfigError) as err:
        _error(str(err))
        return 2
    except OSError as err:
        if isinstance(err, BrokenPipeError):  # e.g. `loadax-mesh plan ... | head`
            sys.stderr.close()
            return 0
        _error(f"{err.filename or ''}: {err.strerror or err}".lstrip(": "))
        return 2
    except SystemExit as exit_:  # --help and argparse's own exits
        return exit_.code if isinstance(exit_.code, int) else 0


def _error(message: str) -> None:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)


# -- plan -----------------------------------------------------------------------------------


def _cmd_plan(args: argparse.Namespace) -> int:
    devices, selector = _devices(args)
    config, source = _config(args, selector)
    notes = [source, *_device_notes(devices)]
    plan = _plan_with_notes(config, devices, selector, args.granule, notes)
    if args.devices == "local":
        import jax

        mesh = plan.to_jax_mesh()
        notes.append(f"built jax.sharding.Mesh {dict(mesh.shape)} from jax.devices()")
        if jax.process_index() != 0:  # under `launch`: process 0 speaks for the job
            return 0
    from . import picture, render

    rows = None if args.global_batch is None else render.host_rows(plan, args.global_batch)
    if args.svg:
        with open(args.svg, "w", encoding="utf-8") as f:
            f.write(picture.render_svg(plan))
    if args.format == "json":
        data = {
            **plan.to_dict(),
            "hardware_summary": render.hardware_summary(plan),
            "strategy": args.strategy,
            "notes": notes,
            "global_batch": args.global_batch,
            "host_rows": None if rows is None else [r.to_dict() for r in rows],
            "svg": args.svg,
        }
        _print_json(data)
        return 0
    text = render.render_text(
        plan, global_batch=args.global_batch, color=_use_color(args.color), notes=tuple(notes)
    )
    print(text + (f"\n\nsvg        wrote {args.svg}" if args.svg else ""))
    return 0


def _devices(args: argparse.Namespace) -> tuple[list[Any], str]:
    """The device set the flags name, and its hardware string."""
    if (args.hardware is None) != (args.devices == "local"):
        raise UsageError(
            f"{args.command} needs exactly one of HARDWARE (e.g. tpu-v5p-512) and --devices local"
        )
    if args.devices == "local":
        from .detect import detect_hardware

        devices: list[Any] = _jax_devices()
        return devices, detect_hardware(devices)
    if args.devices in ("aot", "libtpu") or args.command == "compile":
        if args.devices == "libtpu" and not args.hardware.startswith("tpu-"):
            raise UsageError(
                f"--devices libtpu takes TPU strings, not {args.hardware!r}; accepted for "
                "any TPU or GPU string: --devices aot"
            )
        os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile-only: no accelerator needed
        from .topology import topology_devices

        return topology_devices(args.hardware), args.hardware
    from .hardware import simulate_devices

    return simulate_devices(args.hardware), args.hardware


def _device_notes(devices: Any) -> list[str]:
    """What to say about compile-only devices: whose they are, and how they differ from the
    real machine's (v4; GPU's slice_index)."""
    if not hasattr(devices, "difference"):
        return []
    difference = devices.difference
    client = "XLA's CUDA client" if devices.hardware.startswith("gpu-") else "libtpu"
    notes = [f"devices: {client}'s compile-only devices for {devices.hardware}"]
    return notes + ([f"differs from the real machine: {difference}"] if difference else [])


def _cmd_compile(args: argparse.Namespace) -> int:
    from .cli_compile import compile_command

    devices, selector = _devices(args)
    config, source = _config(args, selector)
    notes = [source, *_device_notes(devices)]
    plan = _plan_with_notes(config, devices, selector, args.granule, notes)
    return compile_command(args, plan, notes, _print_json)


def _cmd_models(args: argparse.Namespace) -> int:
    from .cli_compile import models_command

    return models_command(args, _print_json)


def _config(args: argparse.Namespace, selector: str) -> tuple[MeshConfig, str]:
    """The MeshConfig the flags describe, and a sentence saying where its shape comes from."""
    from .config import MeshConfig
    from .render import show_shape
    from .shapes import HybridMeshShape

    if args.shape is None:
        for flag in ("dcn_shape", "axes"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} needs --shape")
    if args.strategy is None:
        if args.shape is None:
            raise UsageError(
                f"plan needs --strategy (one of {_preset_names()}) or --shape with --axes"
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
        else axes[0]
    )
    if args.shape is not None:
        shape: Any = _ints(args.shape, "--shape")
        if args.dcn_shape is not None:
            shape = HybridMeshShape(shape, _ints(args.dcn_shape, "--dcn-shape"))
        config = MeshConfig(shape, axes, batch)
        return config, f"shape {show_shape(config.mesh_shape)} from --shape"
    assert preset is not None
    config = MeshConfig(preset.mesh_shape, axes, batch, preset.mesh_rules)
    rules = config.mesh_rules or ()
    for regex, _value in rules:
        if re.fullmatch(regex, selector):
            return config, (
                f"preset {args.strategy}: rule '{regex}' matches {selector}, shape "
                f"{show_shape(config.select(selector).mesh_shape)}"
            )
    return config, (
        f"preset {args.strategy}: none of its {len(rules)} mesh rules matches "
        f"{selector}, so its default shape {show_shape(config.mesh_shape)} is used"
    )


def _plan_with_notes(
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
            raise UsageError(f"--set {item!r}; accepted: AXIS=SIZE such as tp=8")
        result[match[1]] = int(match[2])
    return result


def _use_color(mode: str) -> bool:
    if mode != "auto":
        return mode == "always"
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def _print_json(data: Any) -> None:
    import json

    print(json.dumps(data, indent=1))


def _preset_names() -> str:
    from .presets import list_presets

    return ", ".join(list_presets())


# -- hardware, presets, devices ---------------------------------------------------------------


def _cmd_hardware(args: argparse.Namespace) -> int:
    from . import render
    from .hardware import list_hardware

    types = list_hardware()
    if args.format == "json":
        _print_json([render.hardware_data(t) for t in types])
    else:
        print(render.hardware_text(types))
    return 0


def _cmd_presets(args: argparse.Namespace) -> int:
    from . import render
    from .presets import get_preset, list_presets

    presets = [get_preset(name) for name in list_presets()]
    if args.format == "json":
        _print_json(render.presets_data(presets))
    else:
        print(render.presets_text(presets))
    return 0


def _jax_devices() -> list[Any]:
    """`jax.devices()`, after joining the job when started by `loadax-mesh launch`."""
    from .distributed import initialize, launched

    if launched():
        initialize()
    import jax

    from ._stderr import quiet_stderr

    try:
        with quiet_stderr(replay_on_error=False):  # the error line below says what failed
            return list(jax.devices())
    except RuntimeError as err:  # no backend for JAX_PLATFORMS, e.g. tpu without a TPU
        raise UsageError(f"jax.devices() failed: {err}") from None


def _cmd_devices(args: argparse.Namespace) -> int:
    import jax

    from .detect import generic_selector, match_catalogue
    from .devices import read_devices
    from .render import catalogue_lines, platform_facts, text_table

    devices = _jax_devices()
    if jax.process_index() != 0:  # under `launch`: every process sees the same global set
        return 0
    table = read_devices(devices)
    name, miss = match_catalogue(table)
    selector = name or generic_selector(table)
    keys = ["id", "platform", "device_kind", "process_index", "slice_index", "coords"]
    keys += ["core_on_chip", "local_hardware_id"]
    records = [{k: _plain(getattr(d, k, None)) for k in keys} for d in devices]
    if args.format == "json":
        process = {"process_index": jax.process_index(), "process_count": jax.process_count()}
        found = {"hardware": selector, "catalogue_miss": miss or None}
        _print_json({**found, **process, "devices": records})
        return 0
    rows = [keys] + [[r[k] for k in keys] for r in records[:MAX_DEVICE_LINES]]
    n = len(devices)
    lines = [
        f"hardware {selector}: {n} device{'s' * (n != 1)}, process {jax.process_index()} of "
        f"{jax.process_count()}",
        *catalogue_lines(miss, platform_facts(table.platform)),
    ]
    print("\n".join(lines) + f"\n\n{text_table(rows)}")
    if len(records) > MAX_DEVICE_LINES:
        print(f"... {len(records) - MAX_DEVICE_LINES} more (all of them: --format json)")
    return 0


def _plain(value: Any) -> Any:
    """A device attribute as JSON-ready data (jax gives coords as lists of ints)."""
    if value is None or isinstance(value, int | str | float):
        return value
    try:
        return [v if isinstance(v, int | str) else int(v) for v in value]
    except (TypeError, ValueError):
        return str(value)
