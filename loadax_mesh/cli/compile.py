"""The CLI's workload commands: `models` (the model catalogue) and `compile` (the reference step
compiled for a plan, with what the compiler says), as text or JSON."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .args import non_negative_int, positive_int, print_json

if TYPE_CHECKING:
    from ..plan import MeshPlan

# The workload flags of `compile`, `estimate` and `plan --strategy auto` (where --model is
# needed only for auto and --global-batch is the plan's own flag).
WORKLOAD_FLAGS: dict[str, tuple[dict[str, Any], str]] = {
    "--model": ({"metavar": "M"}, "a model (`loadax-mesh models`)"),
    "--remat": (
        {"metavar": "POLICY"},
        "where the backward pass finds each tensor of a layer: a policy (full, the default: "
        "only layer inputs saved; dots; none; offload: layer inputs in host memory) or "
        "tensor=placement pairs such as layer_input=offload,query=offload (placements: "
        "recompute, device, offload; tensors not named are recomputed); with --strategy auto "
        "it narrows the recipe search",
    ),
    "--microbatches": (
        {"type": positive_int, "metavar": "M"},
        "gradient accumulation: the step's batch run in M slices (default 1; with --strategy "
        "auto: searched unless given)",
    ),
    "--pipeline-microbatches": (
        {"type": non_negative_int, "metavar": "M"},
        "a mesh with a pipeline axis: M micro-batches flow through its stages (default 0: as "
        "many as stages)",
    ),
    "--pipeline-repeats": (
        {"type": positive_int, "metavar": "R"},
        "a mesh with a pipeline axis: each stage holds R chunks of layers (default 1: GPipe; "
        "more: the circular schedule)",
    ),
    "--pipeline-layers": (
        {"type": non_negative_int, "metavar": "N"},
        "a mesh with a pipeline axis: the last N decoder layers are pipelined, the rest run "
        "with the pipeline axis as data (default 0: every layer)",
    ),
    "--pipeline-remat": (
        {"choices": ["layer", "iteration"]},
        "a mesh with a pipeline axis: where the stages checkpoint under --remat: layer (each "
        "layer; the default) or iteration (a stage's chunk of layers as one, as MaxText's "
        "pipeline does: more memory)",
    ),
    "--logits-chunks": (
        {"type": positive_int, "metavar": "C"},
        "the loss computed over C slices of the tokens (default 1; with --strategy auto: "
        "searched unless given)",
    ),
    "--moe": (
        {"choices": ["dropless", "capacity"]},
        "a model with experts: dropless (every token copy computed; the default) or capacity "
        "(at most 1.25 x the even share of copies per expert, the rest dropped); with "
        "--strategy auto: both searched unless given",
    ),
    "--attention": (
        {"default": "flash", "choices": ["flash", "plain"]},
        "flash: splash kernel on TPU, cuDNN on GPU; plain: XLA with the scores written out",
    ),
    "--fact": (
        {"dest": "facts", "action": "append", "default": [], "metavar": "NAME=VALUE"},
        "set a catalogue fact of the hardware for this run, with its unit, e.g. "
        "host_link_bandwidth=100GB/s (repeatable); reported as given by the user",
    ),
}


def models_command(args: argparse.Namespace) -> int:
    from ..view.report import text_table
    from ..workload import ModelSpec, list_models

    models = [ModelSpec.from_name(name) for name in list_models()]
    if args.format == "json":
        print_json([{**vars(m), "num_params": m.num_params} for m in models])
        return 0
    keys = ["num_layers", "d_model", "d_ff", "num_heads", "num_kv_heads", "head_dim"]
    rows: list[list[Any]] = [
        ["model", "params", "layers", "d_model", "d_ff", "heads", "kv", "head", "vocab", "seq"]
    ]
    for m in models:
        rows.append(
            [
                m.name,
                _params_text(m.num_params),
                *(getattr(m, k) for k in keys),
                m.vocab_size,
                m.seq_len,
            ]
        )
    print(text_table(rows))
    print("\nSources: configs/models/<name>.toml (or --format json)")
    return 0


def compile_command(args: argparse.Namespace, plan: MeshPlan, notes: list[str]) -> int:
    from ..compiler.report import compile_step
    from ..view.compile import render_report
    from .cost import given_facts, specs

    model, train = specs(args)
    with _progress(f"compiling {model.name} for {plan.hardware}"):
        report = compile_step(plan, model, train, facts=given_facts(args))
    if args.format == "json":
        print_json({**report.to_dict(), "notes": notes})
    else:
        print(render_report(report, notes))
    return 0


def _params_text(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


@contextmanager
def _progress(what: str) -> Iterator[None]:
    """A line on stderr that counts seconds while XLA compiles (a plain line if not a TTY)."""
    if not sys.stderr.isatty():
        print(f"{what} (XLA; this can take a minute) ...", file=sys.stderr, flush=True)
        yield
        return
    done = threading.Event()
    start = time.perf_counter()

    def tick() -> None:
        spin = "|/-\\"
        k = 0
        while not done.wait(0.25):
            seconds = time.perf_counter() - start
            print(f"\r{spin[k % 4]} {what}: {seconds:.0f} s", end="", file=sys.stderr, flush=True)
            k += 1
        print("\r\033[K", end="", file=sys.stderr, flush=True)

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
