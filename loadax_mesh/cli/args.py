"""The command line's shared pieces: the error it reports, the flags that describe a mesh and
a workload (one flag for each TrainSpec field, made from the dataclass), and turning them into
a MeshConfig, a plan (with the planner's warnings as notes) and a TrainSpec."""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
from dataclasses import MISSING, fields, replace
from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin, get_type_hints

from ..errors import MeshConfigError

if TYPE_CHECKING:
    from ..config import MeshConfig
    from ..plan import MeshPlan
    from ..workload.model import ModelSpec
    from ..workload.spec import TrainSpec


PROG = "loadax-mesh"  # the command, as its messages name it


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


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive finite number")
    return value


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


# What the command line adds to a TrainSpec field's docstring in its flag's help: how a flag
# writes what Python passes otherwise, and what `--strategy auto` searches when the flag is not
# given (the recipe fields of cost/choose/recipes.py, RECIPE_FIELDS).
FLAG_NOTES = {
    "remat": "On the command line a policy or tensor=placement pairs such as "
    "layer_input=offload,query=offload (tensors not named are recomputed).",
}
# Choices a flag takes for `--strategy auto` alone: what the search may vary (the user asks)
AUTO_ONLY = {"moe": ("any",)}
AUTO_SEARCHES = {
    "remat": "searched unless given",
    "microbatches": "searched unless given",
    "logits_chunks": "searched unless given",
    "moe": "kept as given (dropless by default); `any` searches both paths",
    "pipeline_microbatches": "searched on meshes with a pipeline axis unless given",
    "pipeline_repeats": "searched on meshes with a pipeline axis unless given",
    "pipeline_schedule": "on meshes with a pipeline axis, 1f1b searched where gpipe's memory "
    "does not fit, unless given",
}
# A field whose flag takes text that a parser turns into the field's value
TEXT_FIELDS = {"remat": "POLICY"}


def train_flags() -> dict[str, tuple[dict[str, Any], str]]:
    """A flag for each TrainSpec field but `global_batch` (PLAN_FLAGS' --global-batch): the
    field's name with dashes, argparse's type or choices from the field's type (a Literal's
    values; an int field whose default is 0 takes 0), the field's docstring as its help, and
    None as its default: not given, the field keeps TrainSpec's default."""
    from ..workload.spec import TrainSpec, field_docs

    hints, docs = get_type_hints(TrainSpec), field_docs()
    out: dict[str, tuple[dict[str, Any], str]] = {}
    for f in fields(TrainSpec):
        if f.name == "global_batch":
            continue
        hint = hints[f.name]
        options: dict[str, Any]
        if get_origin(hint) is Literal:
            options = {"choices": list(get_args(hint)) + list(AUTO_ONLY.get(f.name, ()))}
        elif f.name in TEXT_FIELDS:
            options = {"metavar": TEXT_FIELDS[f.name]}
        elif hint is int:
            options = {"type": positive_int if f.default else non_negative_int, "metavar": "N"}
        elif hint is float:
            options = {"type": positive_float, "metavar": "X"}
        elif hint is bool:
            options = {"action": argparse.BooleanOptionalAction}
        else:
            raise TypeError(f"TrainSpec.{f.name}: {hint} has no flag type; give it one here")
        text = " ".join([docs[f.name], FLAG_NOTES.get(f.name, "")]).strip()
        if f.name in AUTO_SEARCHES:
            text += f" With --strategy auto: {AUTO_SEARCHES[f.name]}."
        default = "" if f.default is MISSING else f" (default: {f.default})"
        out[f"--{f.name.replace('_', '-')}"] = (options, (text + default).replace("%", "%%"))
    return out


MODEL_HELP = (
    "a model: a catalogue name (`loadax-mesh models`) or a model file, a TOML in the "
    "catalogue's schema or a Hugging Face config.json (ModelSpec.from_file)"
)
SEQ_LEN_HELP = (
    "the run's sequence length, tokens a sequence (default: the model's seq_len; a "
    "config.json's max_position_embeddings)"
)


def workload_flags() -> dict[str, tuple[dict[str, Any], str]]:
    """The workload flags of `compile`, `estimate` and `plan` (which reads them for `--strategy
    auto` and `--format maxtext`): --model, --seq-len, every TrainSpec field's, and --fact."""
    return {
        "--model": ({"metavar": "M"}, MODEL_HELP),
        "--seq-len": ({"type": positive_int, "metavar": "N"}, SEQ_LEN_HELP),
        **train_flags(),
        "--fact": (
            {"dest": "facts", "action": "append", "default": [], "metavar": "NAME=VALUE"},
            "set a catalogue fact of the hardware for this run, with its unit, e.g. "
            "host_link_bandwidth=100GB/s (repeatable); reported as given by the user",
        ),
    }


def read_model(text: str) -> ModelSpec:
    """The model `--model` names: a catalogue name, else a model file (a path, or a name ending
    in .toml or .json)."""
    from ..workload.model import ModelSpec, list_models

    names = list_models()
    if text in names:
        return ModelSpec.from_name(text)
    if "/" in text or os.sep in text or text.endswith((".toml", ".json")) or os.path.isfile(text):
        return ModelSpec.from_file(text)
    raise MeshConfigError(
        f"model={text!r} is not a known model nor a model file; accepted: {', '.join(names)}, "
        "or the path of a model file (a .toml in the catalogue's schema or a Hugging Face "
        "config.json)"
    )


def model_from_args(args: argparse.Namespace) -> ModelSpec | None:
    """The model the flags name, at --seq-len where given (None without --model); read once
    (kept on `args`)."""
    if getattr(args, "model_spec", None) is not None:
        return args.model_spec
    seq_len = getattr(args, "seq_len", None)
    if args.model is None:
        if seq_len is not None:
            raise UsageError("--seq-len N needs --model M (the model whose sequences it sets)")
        return None
    model = read_model(args.model)
    args.model_seq_len = model.seq_len
    if seq_len is not None:
        model = replace(model, seq_len=seq_len)
    args.model_spec = model
    return model


def model_notes(args: argparse.Namespace) -> list[str]:
    """What a report says of the model: the file it was read from, and the sequence length
    --seq-len set in place of the model's own."""
    model = model_from_args(args)
    if model is None:
        return []
    notes = [] if args.model == model.name else [f"model {model.name} read from {args.model}"]
    if getattr(args, "seq_len", None) is not None:
        notes.append(
            f"sequence length {model.seq_len} from --seq-len (the model's own: "
            f"{args.model_seq_len})"
        )
    return notes


def given_fields(args: argparse.Namespace) -> list[str]:
    """The TrainSpec fields whose flags are given, in the dataclass's order (--global-batch,
    a plan flag, left out)."""
    from ..workload.spec import TrainSpec

    names = [f.name for f in fields(TrainSpec) if f.name != "global_batch"]
    return [k for k in names if getattr(args, k, None) is not None]


def train_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The TrainSpec fields the flags give (each flag not given is left out), as TrainSpec
    takes them (--remat's pairs parsed)."""
    from ..workload.spec import parse_remat

    parsers = {"remat": parse_remat}
    given = {k: getattr(args, k) for k in given_fields(args)}
    for k, choices in AUTO_ONLY.items():  # `--strategy auto` reads these itself
        if given.get(k) in choices:
            if getattr(args, "strategy", None) != "auto":
                raise UsageError(f"--{k.replace('_', '-')} {given[k]} is for --strategy auto")
            del given[k]
    return {k: parsers[k](v) if k in parsers else v for k, v in given.items()}


def train_from_args(args: argparse.Namespace) -> TrainSpec:
    """The one TrainSpec the flags describe: --global-batch and every field flag given, the
    rest TrainSpec's defaults. The caller says first why --global-batch is needed."""
    from ..workload.spec import TrainSpec

    if args.global_batch is None:
        raise UsageError(f"{args.command} needs --global-batch N")
    return TrainSpec(global_batch=args.global_batch, **train_fields(args))


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
