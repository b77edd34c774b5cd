"""The CLI's workload commands: `models` (the model catalogue) and `compile` (the reference step
compiled for a plan, with what the compiler says), as text or JSON."""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from .args import PROG, print_json

if TYPE_CHECKING:
    from ..plan import MeshPlan
    from ..workload import TrainSpec


def models_command(args: argparse.Namespace) -> int:
    """The catalogue, or (`--model`) one model, a catalogue name or a model file."""
    from ..view.models import model_data, model_text, models_text
    from ..workload import ModelSpec, list_models
    from .args import read_model

    if args.model is not None:
        model = read_model(args.model)
        if args.format == "json":
            print_json(model_data(model))
        else:
            print(model_text(model, args.model))
        return 0
    models = [ModelSpec.from_name(name) for name in list_models()]
    if args.format == "json":
        print_json([model_data(m) for m in models])
    else:
        print(models_text(models))
    return 0


def compile_command(
    args: argparse.Namespace, plan: MeshPlan, notes: list[str], chosen: TrainSpec | None
) -> int:
    """Compile the step the flags describe (`chosen`: `--strategy auto`'s recipe) for `plan`."""
    from ..compiler.report import compile_step
    from ..errors import MeshConfigError
    from ..view.compile import render_report
    from .args import model_notes
    from .cost import given_facts, specs

    model, train = specs(args, chosen)
    notes = [*notes, *model_notes(args)]
    try:
        with _progress(f"compiling {model.name} for {plan.hardware}"):
            report = compile_step(plan, model, train, facts=given_facts(args))
    except MeshConfigError:
        raise
    except Exception as err:  # the compiler's own failure: one line, no traceback
        mesh = " x ".join(f"{a} {n}" for a, n in plan.shape.items())
        print(
            f"{PROG}: error: compiling {model.name} (seq_len {model.seq_len}) for "
            f"{plan.hardware} on the mesh {mesh} failed: {compiler_reason(err)}",
            file=sys.stderr,
        )
        return 1
    if args.format == "json":
        print_json({**report.to_dict(), "notes": notes})
    else:
        print(render_report(report, notes))
    return 0


def compiler_reason(err: BaseException) -> str:
    """The compiler's reason for a failed compile, on one line: the last Python exception
    its message carries (jax's custom partitioners report theirs inside XLA's error), else
    the message's first line, with the error's type."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    raised = [line for line in lines if _RAISED.match(line)]
    reason = raised[-1] if raised else f"{type(err).__name__}: {lines[0] if lines else err!r}"
    return reason if len(reason) <= 400 else reason[:397] + "..."


# A line that names a raised exception, as a traceback's last line does.
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): \S")


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
