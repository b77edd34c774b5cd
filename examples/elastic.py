"""Elastic training: lose a process, replan on what is left, resume from an Orbax checkpoint.

    python examples/elastic.py --ckpt /tmp/run                              # 8 local devices
    loadax-mesh launch --nprocs 4 --devices-per-process 2 --max-restarts 1 -- \\
        python examples/elastic.py --ckpt /tmp/run --die-at 4

Trains the reference model (`tiny`) on a `data x fsdp` mesh, saving the parameters and Adam
state with Orbax every `--save-every` steps. With `--die-at S` the last process kills itself
(SIGKILL, a host lost; or `sys.exit(N)` with `--exit-code N`) at the start of step S of the
first run; with `--die-in-save S` it is killed inside the save of step S, its part written to
Orbax's temporary directory but the step not committed. jax's runtime then ends its peers; the
launcher tells them from the process that failed first, and starts the job again without that
one (`LOADAX_RESTART=1`). Every run, the first and each restarted
one, does the same: `replan` the config on the devices it sees (granules that lost devices are
dropped; micro-batches rise so that no device holds more rows than the first run's budget),
restore the latest checkpoint resharded onto the new mesh, and continue. Step s always trains
on the same global batch (made from seed s); each host loads only its rows of it
(`host_batch_slice`), so the data order does not depend on how many processes there are.

Process 0 prints `run R step S loss L` for every step it runs and, with `--out FILE`, writes
the final parameters there (numpy .npz).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from common import lm  # joins the job under `launch`; else 8 CPU devices
from jax.experimental import multihost_utils

from loadax_mesh import distributed
from loadax_mesh.workload.step import make_step

CONFIG = lm.MeshConfig((-1, 2), ("data", "fsdp"), "data")  # data adapts to the devices left
MODEL = lm.ModelSpec.from_name("tiny")
UNCOMMITTED = ".orbax-checkpoint-tmp"  # Orbax writes a step here, then renames it: the commit


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", required=True, help="checkpoint directory (shared by runs)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save-every", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=12)
    parser.add_argument("--die-at", type=int, default=0, help="first run: last process dies")
    parser.add_argument("--exit-code", type=int, default=0, help="--die-at by sys.exit(N)")
    parser.add_argument("--die-in-save", type=int, default=0, help="first run: killed in save")
    parser.add_argument("--out", help="write the final parameters here (.npz)")
    return parser.parse_args()


def budget(ckpt: Path, global_batch: int) -> int:
    """Rows a device may hold: the first run's (global batch / its data-parallel degree),
    kept next to the checkpoints so that a restarted run reads the same budget."""
    path = ckpt / "budget.json"
    if path.exists():
        return int(json.loads(path.read_text())["rows_per_device"])
    rows = global_batch // CONFIG.plan().data_parallel_size
    multihost_utils.sync_global_devices("budget: read")
    if jax.process_index() == 0:
        path.write_text(json.dumps({"rows_per_device": rows}))
    multihost_utils.sync_global_devices("budget: written")
    return rows


class SaveThenDie(ocp.StandardCheckpointHandler):
    """Orbax's own handler; when `doomed`, the process is killed (SIGKILL) once its shards of
    the step are written to the step's temporary directory, before Orbax commits the step
    (renames it into place, after every process has written its part)."""

    doomed = False

    async def async_save(self, directory: Any, *args: Any, **kwargs: Any) -> Any:
        futures = await super().async_save(directory, *args, **kwargs)
        if self.doomed:
            for future in futures or []:
                future.result()  # this process's part is on disk
            print(f"process {jax.process_index()} killed inside the save", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return futures


def batch_for(step: int, rows: lm.HostBatchSlice, global_batch: int) -> dict[str, np.ndarray]:
    """This host's rows of step `step`'s global batch (the same batch whatever the mesh)."""
    seq = MODEL.seq_len
    tokens = np.random.default_rng(step).integers(0, MODEL.vocab_size, (global_batch, seq + 1))
    mine = tokens[rows.as_slice()].astype(np.int32)
    return {"tokens": mine[:, :-1], "targets": mine[:, 1:]}


def main() -> None:
    args = parse()
    ckpt = Path(args.ckpt).resolve()
    ckpt.mkdir(parents=True, exist_ok=True)
    run, me = distributed.restart_count(), jax.process_index()
    rows_per_device = budget(ckpt, args.global_batch)
    plan = lm.replan(
        CONFIG, jax.devices(), global_batch=args.global_batch, rows_per_device=rows_per_device
    )
    mesh = plan.plan.to_jax_mesh()
    train = lm.TrainSpec(
        global_batch=args.global_batch,
        microbatches=plan.microbatches,
        compute_dtype="float32",
        remat="none",
        learning_rate=3e-3,
    )
    step = make_step(mesh, MODEL, train, batch_axes=CONFIG.batch_axis_names)
    rows = lm.host_batch_slice(mesh, args.global_batch, CONFIG.batch_axis_names)
    if me == 0:
        print(
            f"run {run}: {jax.process_count()} processes, mesh {dict(mesh.shape)}, "
            f"{plan.microbatches} micro-batches, budget {rows_per_device} rows a device",
            flush=True,
        )
    print(f"run {run}: process {me} loads rows {rows.start}:{rows.stop}", flush=True)

    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False)
    handler, handlers = SaveThenDie(), ocp.handlers.DefaultCheckpointHandlerRegistry()
    handlers.add(None, ocp.args.StandardSave, handler)
    handlers.add(None, ocp.args.StandardRestore, handler)
    last = run == 0 and me == jax.process_count() - 1  # the process that dies, if one does
    with ocp.CheckpointManager(
        ckpt / "state", options=options, handler_registry=handlers
    ) as manager:
        start = manager.latest_step()
        if start is None:
            params, opt = step.init(jax.random.key(0))
            start = 0
        else:  # restored onto this run's mesh: the shardings of the step's own arguments
            abstract = {"params": step.abstract_args()[0], "opt": step.abstract_args()[1]}
            state = manager.restore(start, args=ocp.args.StandardRestore(abstract))
            params, opt = state["params"], state["opt"]
            if me == 0:  # a step whose save was cut short stays uncommitted: never read
                cut = sorted(p.name for p in manager.directory.iterdir() if UNCOMMITTED in p.name)
                aside = f"; uncommitted, not read: {', '.join(cut)}" if cut else ""
                print(f"run {run}: restored step {start}{aside}", flush=True)
        for s in range(start + 1, args.steps + 1):
            if last and s == args.die_at:
                jax.block_until_ready(params)  # the steps before this one done everywhere
                if args.exit_code:
                    sys.exit(args.exit_code)
                os.kill(os.getpid(), signal.SIGKILL)  # a host lost
            batch = lm.shard_batch(batch_for(s, rows, args.global_batch), mesh, "data")
            params, opt, loss = step.fn(params, opt, batch)
            if me == 0:
                print(f"run {run} step {s} loss {float(loss)!r}", flush=True)
            if s % args.save_every == 0:
                handler.doomed = last and s == args.die_in_save
                manager.save(s, args=ocp.args.StandardSave({"params": params, "opt": opt}))
    final = multihost_utils.process_allgather(params, tiled=True)
    if args.out and me == 0:
        np.savez(args.out, **{k.replace("/", "."): np.asarray(v) for k, v in final.items()})


if __name__ == "__main__":
    main()
