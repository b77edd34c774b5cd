"""`loadax-mesh replan HARDWARE --lose host:3`: what `replan` does when a job loses hardware.

Plans the config on the simulated hardware (the job as it started, whose rows per device are
the budget), removes the lost hosts or slices, and shows `replan`'s answer: the granules dropped
whole, the mesh on the rest, and the micro-batches that keep the global batch within the
budget. Like `plan` for simulated hardware, it imports no jax.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from .args import PLAN_FLAGS, UsageError, config_from_args, positive_int, print_json

HELP = (
    "what replan does when a job loses hosts or slices: the granules dropped, the mesh on the "
    "rest, the micro-batches that keep the global batch (simulated hardware; no jax)"
)


def _loss(text: str) -> tuple[str, int]:
    match = re.fullmatch(r"(host|slice):(\d+)", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r}; accepted: host:N or slice:N")
    return match.group(1), int(match.group(2))


def add_parser(sub: Any) -> None:
    """Add the `replan` command to the CLI's subparsers."""
    command = sub.add_parser("replan", help=HELP, description=HELP)
    command.set_defaults(run=replan_command)
    command.add_argument("hardware", metavar="HARDWARE", help="the job's hardware as it started")
    for flag, (options, text) in PLAN_FLAGS.items():
        if flag != "--devices":
            command.add_argument(flag, **options, help=text)
    command.add_argument(
        "--lose",
        type=_loss,
        action="append",
        required=True,
        metavar="host:N|slice:N",
        help="a host (process_index N) or slice (slice_index N) lost (repeatable)",
    )
    command.add_argument(
        "--rows-per-device",
        type=positive_int,
        metavar="R",
        help="the most rows a device may hold in one micro-batch (default: the job's before the "
        "loss, global batch / data-parallel degree)",
    )
    command.add_argument("--format", default="text", choices=["text", "json"])


def replan_command(args: argparse.Namespace) -> int:
    from ..hardware.strings import simulate_devices
    from ..jobs.replan import replan

    if args.global_batch is None:
        raise UsageError("replan needs --global-batch N (the batch the job must keep)")
    devices = simulate_devices(args.hardware)
    config, source = config_from_args(args, args.hardware)
    before = config.plan(devices, selector=args.hardware, granule=args.granule)
    dp = before.data_parallel_size
    budget = args.rows_per_device
    if budget is None:
        if args.global_batch % dp:
            raise UsageError(
                f"--global-batch {args.global_batch} does not divide by the data-parallel degree "
                f"{dp} before the loss; accepted: a multiple of {dp}, or --rows-per-device R"
            )
        budget = args.global_batch // dp
    rest = _remove(devices, args.lose)
    got = replan(
        config,
        rest,
        global_batch=args.global_batch,
        rows_per_device=budget,
        hardware=args.hardware,
        granule=args.granule,
    )
    lost = ", ".join(f"{what} {n}" for what, n in args.lose)
    if args.format == "json":
        print_json(
            {
                "hardware": args.hardware,
                "lost": [{"kind": what, "index": n} for what, n in args.lose],
                "before": {"shape": before.shape, "data_parallel_size": dp},
                "rows_per_device_budget": budget,
                "global_batch": args.global_batch,
                "granule": got.granule,
                "dropped_granules": list(got.dropped_granules),
                "dropped_devices": [int(d.id) for d in got.dropped],
                "microbatches": got.microbatches,
                "rows_per_device": got.rows_per_device,
                "plan": got.plan.to_dict(),
            }
        )
        return 0
    print(_text(args, source, before, got, budget, len(devices) - len(rest), lost))
    return 0


def _remove(devices: list[Any], losses: list[tuple[str, int]]) -> list[Any]:
    """`devices` without the lost hosts and slices; an index that names none is an error."""
    for what, n in losses:
        attr = "process_index" if what == "host" else "slice_index"
        present = sorted({getattr(d, attr) for d in devices})
        if n not in present:
            raise UsageError(
                f"--lose {what}:{n}: there is no {what} {n}; accepted: {what} "
                f"{present[0]} to {present[-1]}"
            )
    hosts = {n for what, n in losses if what == "host"}
    slices = {n for what, n in losses if what == "slice"}
    return [d for d in devices if d.process_index not in hosts and d.slice_index not in slices]


def _text(
    args: argparse.Namespace,
    source: str,
    before: Any,
    got: Any,
    budget: int,
    gone: int,
    lost: str,
) -> str:
    from ..view.picture import shape_text
    from ..view.report import render_text

    n_before = before.devices.size
    kind = got.granule
    dropped = (
        ", ".join(f"{kind} {k}" for k in got.dropped_granules) + f": {len(got.dropped)} devices "
        "left idle (a granule that lost a device is dropped whole)"
        if got.dropped
        else f"no {kind} is short: only the lost devices are gone"
    )
    micro = got.global_batch // got.microbatches
    rows = (
        [
            "           each host loads its rows below once a step, run as "
            f"{got.microbatches} micro-batches"
        ]
        if got.microbatches > 1
        else []
    )
    lines = [
        f"before     {args.hardware}: {shape_text(before.shape)} on {n_before} devices, "
        f"data-parallel degree {before.data_parallel_size}; budget {budget} rows a device",
        f"lost       {lost}: {gone} devices",
        f"dropped    {dropped}",
        f"after      {shape_text(got.plan.shape)} on {got.plan.devices.size} devices, "
        f"data-parallel degree {got.plan.data_parallel_size}",
        f"batch      global batch {got.global_batch} kept: {got.microbatches} micro-batch"
        f"{'es' * (got.microbatches > 1)} of {micro} rows, {got.rows_per_device} rows a device",
        *rows,
        "",
    ]
    report = render_text(got.plan, global_batch=got.global_batch, notes=(source,))
    return "\n".join(lines) + "\n" + report.split("\n\ngrid")[0]
