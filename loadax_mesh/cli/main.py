"""`loadax-mesh`: plan device meshes from the command line.

`loadax-mesh plan tpu-v5p-512 --strategy fsdp` plans for simulated hardware through the pure core
and the catalogue, without importing jax; only `--devices local`, `devices` and `launch` touch
jax. Bad input prints one line, `loadax-mesh: error: ...`, and exits with code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import MeshConfigError
from .args import (
    MODEL_HELP,
    PICTURE_FLAGS,
    PLAN_FLAGS,
    PROG,
    Parser,
    UsageError,
    config_from_args,
    given_fields,
    model_from_args,
    model_notes,
    plan_with_notes,
    print_json,
    workload_flags,
)
from .export import EXPORT_FORMATS, FORMAT_HELP, refuse_unread_flags

if TYPE_CHECKING:
    from ..cost import Ranking
    from ..plan import MeshPlan
    from ..workload import TrainSpec

CATALOGUE_HELP = (
    "a user catalogue: a TOML file in the schema of configs/hardware.toml whose entries add to "
    "or override the shipped ones for this run (default: $LOADAX_MESH_CATALOGUE, if set)"
)
MAX_DEVICE_LINES = 64


_COMMANDS = {
    "plan": "plan a mesh for a hardware string (simulated; jax is not imported) or for "
    "--devices local",
    "hardware": "the hardware catalogue",
    "presets": "the strategy presets: axes, batch axes, mesh rules",
    "devices": "what jax.devices() holds here, and the detected hardware string",
    "compile": "compile the reference training step for a plan (the real TPU or GPU compiler "
    "for a TPU or GPU string, no accelerator needed; or --devices local) and report memory, "
    "fit, FLOPs and collectives",
    "estimate": "the cost model's estimate of the reference step on a plan: memory terms, "
    "compute, collectives per axis, step time, MFU and the bottleneck (no jax)",
    "models": "the model catalogue for compile and the cost model; --model NAME|FILE: one "
    "model (a catalogue name, a TOML or a Hugging Face config.json) with its parameter counts",
    "launch": "N local processes joined by jax.distributed: launch --nprocs N "
    "--devices-per-process K -- CMD ...",
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Plan JAX device meshes over ICI and DCN.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    runs = dict(
        plan=_cmd_plan,
        hardware=_cmd_hardware,
        presets=_cmd_presets,
        devices=_cmd_devices,
        compile=_cmd_compile,
        estimate=_cmd_estimate,
        models=_cmd_models,
    )
    for name, text in _COMMANDS.items():
        command = sub.add_parser(name, help=text, description=text, add_help=name != "launch")
        if name in runs:
            command.set_defaults(run=runs[name])
            formats = ["text", "json", *(EXPORT_FORMATS if name == "plan" else ())]
            help_ = FORMAT_HELP if name == "plan" else None
            command.add_argument("--format", default="text", choices=formats, help=help_)
    workload = workload_flags()  # --model, a flag for each TrainSpec field, --fact
    for name in ("plan", "compile", "estimate"):
        command = sub.choices[name]
        command.add_argument(
            "hardware",
            nargs="?",
            metavar="HARDWARE",
            help="e.g. tpu-v5p-512, "
            "tpu-v5litepod-256-4, gpu-p5.48xlarge-256, cpu-2x4 (`loadax-mesh hardware`)",
        )
        picture = PICTURE_FLAGS if name == "plan" else {}
        for flag, (options, text) in {**PLAN_FLAGS, **workload, **picture}.items():
            command.add_argument(flag, **options, help=text)
    sub.choices["models"].add_argument(
        "--model", metavar="M", help=f"one model in full, with its parameter counts: {MODEL_HELP}"
    )
    from .replan import add_parser as add_replan

    add_replan(sub)
    for command in sub.choices.values():
        if command.add_help:  # launch passes its own argv on
            command.add_argument("--catalogue", metavar="FILE", help=CATALOGUE_HELP)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 fine, 2 bad input)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        if args_list[:1] == ["launch"]:
            from ..jobs.launcher import main as launch

            return launch(args_list[1:])
        args = build_parser().parse_args(args_list)
        if args.catalogue is None:
            return int(args.run(args))
        from ..hardware.loading import using_catalogue

        with using_catalogue(args.catalogue):
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


def _planned(args: argparse.Namespace) -> tuple[MeshPlan, list[str], Ranking | None]:
    """The plan the flags describe, the notes that explain it, and (`--strategy auto`) the
    ranking its shape won, whose first choice's `train` is the recipe it won with."""
    devices, selector = _devices(args)
    ranking = None
    if args.strategy == "auto":
        from .cost import auto_config

        config, ranking, source = auto_config(args)
    else:
        if args.command == "plan":
            refuse_unread_flags(args)
        config, source = config_from_args(args, selector)
    notes = [source, *_device_notes(devices), *(model_notes(args) if ranking is not None else [])]
    try:
        plan = plan_with_notes(config, devices, selector, args.granule, notes)
    except MeshConfigError as err:
        if not args.overrides:
            raise
        overrides = " ".join(f"--set {item}" for item in args.overrides)
        raise MeshConfigError(f"{err} (the preset's shape after {overrides})") from None
    if ranking is None:
        _refuse_unread_stages(args, plan)
    return plan, notes, ranking


def _refuse_unread_stages(args: argparse.Namespace, plan: MeshPlan) -> None:
    """The --pipeline-* flags are read only where the plan has a pipeline axis larger than 1:
    given for a plan without one, they would change nothing (a UsageError saying so)."""
    from ..workload.layout import PIPELINE_NAMES

    given = [f"--{k.replace('_', '-')}" for k in given_fields(args) if k.startswith("pipeline_")]
    if given and not any(plan.shape.get(a, 1) > 1 for a in PIPELINE_NAMES):
        shape = " x ".join(f"{a}={n}" for a, n in plan.shape.items())
        raise UsageError(
            f"{given[0]} is read only on a mesh with a pipeline axis larger than 1, and this "
            f"plan ({shape}) has none; drop it, or plan stages (e.g. --strategy "
            "pipeline_fsdp_tp --set pp=4, or --axes pipeline,... with --shape)"
        )


def _cmd_plan(args: argparse.Namespace) -> int:
    plan, notes, ranking = _planned(args)
    if args.devices == "local":
        import jax

        mesh = plan.to_jax_mesh()
        notes.append(f"built jax.sharding.Mesh {dict(mesh.shape)} from jax.devices()")
        if jax.process_index() != 0:  # under `launch`: process 0 speaks for the job
            return 0
    if args.format in EXPORT_FORMATS:
        from .export import export_command

        return export_command(args, plan, _chosen(ranking))
    from ..view import picture, report

    rows = None if args.global_batch is None else report.host_rows(plan, args.global_batch)
    if args.svg:
        with open(args.svg, "w", encoding="utf-8") as f:
            f.write(picture.render_svg(plan))
    if args.format == "json":
        data = {
            **plan.to_dict(),
            "hardware_summary": report.hardware_summary(plan),
            "strategy": args.strategy,
            "notes": notes,
            "global_batch": args.global_batch,
            "host_rows": None if rows is None else [r.to_dict() for r in rows],
            "svg": args.svg,
        }
        if ranking is not None:
            from ..view.estimate import ranking_data

            data["ranking"] = {**_workload(args), **ranking_data(ranking)}
        print_json(data)
        return 0
    text = report.render_text(
        plan, global_batch=args.global_batch, color=_use_color(args.color), notes=tuple(notes)
    )
    if ranking is not None:
        from ..view.estimate import ranking_text

        text = ranking_text(ranking) + "\n\n" + text
    print(text + (f"\n\nsvg        wrote {args.svg}" if args.svg else ""))
    return 0


def _workload(args: argparse.Namespace) -> dict[str, Any]:
    """The model `--strategy auto` chose for, and the sequence length it priced."""
    model = model_from_args(args)
    assert model is not None  # auto needs --model
    return {"model": model.name, "seq_len": model.seq_len}


def _devices(args: argparse.Namespace) -> tuple[list[Any], str]:
    """The device set the flags name, and its hardware string."""
    if (args.hardware is None) != (args.devices == "local"):
        raise UsageError(
            f"{args.command} needs exactly one of HARDWARE (e.g. tpu-v5p-512) and --devices local"
        )
    if args.devices == "local":
        from ..hardware.detect import detect_hardware

        devices: list[Any] = _jax_devices()
        return devices, detect_hardware(devices)
    if args.devices in ("aot", "libtpu") or args.command == "compile":
        from ..hardware.profile import hardware_profile

        if args.devices == "libtpu" and hardware_profile(args.hardware).traits.compiler != "libtpu":
            raise UsageError(
                f"--devices libtpu takes TPU strings, not {args.hardware!r}; accepted for "
                "any TPU or GPU string: --devices aot"
            )
        os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile-only: no accelerator needed
        from ..hardware.topology import topology_devices

        return topology_devices(args.hardware), args.hardware
    from ..hardware.strings import simulate_devices

    return simulate_devices(args.hardware), args.hardware


def _device_notes(devices: Any) -> list[str]:
    """What to say about compile-only devices: whose they are, and how they differ from the
    real machine's (v4; GPU's slice_index)."""
    if not hasattr(devices, "difference"):
        return []
    from ..hardware.profile import hardware_profile

    difference = devices.difference
    client = hardware_profile(devices.hardware).traits.compiler
    notes = [f"devices: {client}'s compile-only devices for {devices.hardware}"]
    return notes + ([f"differs from the real machine: {difference}"] if difference else [])


def _chosen(ranking: Ranking | None) -> TrainSpec | None:
    """`--strategy auto`'s recipe: the winner's (None: the flags say it)."""
    return None if ranking is None else ranking[0].train


def _cmd_compile(args: argparse.Namespace) -> int:
    from .compile import compile_command

    plan, notes, ranking = _planned(args)
    return compile_command(args, plan, notes, _chosen(ranking))


def _cmd_estimate(args: argparse.Namespace) -> int:
    from .cost import estimate_command

    plan, notes, ranking = _planned(args)
    return estimate_command(args, plan, notes, _chosen(ranking))


def _cmd_models(args: argparse.Namespace) -> int:
    from .compile import models_command

    return models_command(args)


def _use_color(mode: str) -> bool:
    if mode != "auto":
        return mode == "always"
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


# -- hardware, presets, devices ---------------------------------------------------------------


def _cmd_hardware(args: argparse.Namespace) -> int:
    from ..hardware.catalogue import catalogue
    from ..hardware.strings import list_hardware
    from ..view import report

    types = list_hardware()
    if args.format == "json":
        print_json([report.hardware_data(t) for t in types])
    else:
        print(report.hardware_text(types, user_file=catalogue().user_file))
    return 0


def _cmd_presets(args: argparse.Namespace) -> int:
    from ..presets import get_preset, list_presets
    from ..view import report

    presets = [get_preset(name) for name in list_presets()]
    if args.format == "json":
        print_json(report.presets_data(presets))
    else:
        print(report.presets_text(presets))
    return 0


def _jax_devices() -> list[Any]:
    """`jax.devices()`, after joining the job when started by `loadax-mesh launch`."""
    from ..jobs.distributed import initialize, launched

    if launched():
        initialize()
    import jax

    from ..hardware.stderr import quiet_stderr

    try:
        with quiet_stderr(replay_on_error=False):  # the error line below says what failed
            return list(jax.devices())
    except RuntimeError as err:  # no backend for JAX_PLATFORMS, e.g. tpu without a TPU
        raise UsageError(f"jax.devices() failed: {err}") from None


def _cmd_devices(args: argparse.Namespace) -> int:
    import jax

    from ..hardware.detect import generic_selector, match_catalogue
    from ..hardware.devices import read_devices
    from ..hardware.traits import platform_traits
    from ..view.report import catalogue_lines, text_table

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
        print_json({**found, **process, "devices": records})
        return 0
    rows = [keys] + [[r[k] for k in keys] for r in records[:MAX_DEVICE_LINES]]
    n = len(devices)
    lines = [
        f"hardware {selector}: {n} device{'s' * (n != 1)}, process {jax.process_index()} of "
        f"{jax.process_count()}",
        *catalogue_lines(miss, platform_traits(table.platform).catalogue_facts),
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
