"""Elastic restarts under load: does every restart resume with the uninterrupted losses?

Runs `examples/elastic.py` under `loadax-mesh launch --nprocs 4 --devices-per-process 2
--max-restarts 1 --min-nprocs 2` RUNS times in a row while HOGS busy loops keep the cores busy
(one a core by default). In each, process 3 fails at step 3 (`sys.exit(7)`; `--kill` for
SIGKILL, `--in-save` to kill it inside the save of step 4), jax's runtime ends its peers, and
the launcher must tell the first failure from them: restart on 3 processes, resume from the
last complete checkpoint, and give the losses of an uninterrupted run (one process of 8
devices, run first, without the hogs) to rtol 1e-5. Prints each run and "N of RUNS resumed with
the uninterrupted losses".

    python benchmarks/bench_elastic.py [--runs 10] [--hogs 2] [--kill | --in-save]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
STEPS, SAVE_EVERY, RESUMED, RTOL = 5, 2, 2, 1e-5  # every run resumes from step 2
LAUNCH = ["--nprocs", "4", "--devices-per-process", "2", "--max-restarts", "1"]
LAUNCH += ["--min-nprocs", "2", "--timeout", "500"]


def _run(args: list[str]) -> tuple[int, str, str, float]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    start = time.monotonic()
    done = subprocess.run(args, cwd=EXAMPLES, env=env, capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout, done.stderr, time.monotonic() - start


def _losses(stdout: str, prefix: str = "") -> dict[int, dict[int, float]]:
    """run -> step -> loss, from process 0's `run R step S loss L` lines."""
    found: dict[int, dict[int, float]] = {}
    pattern = rf"^{re.escape(prefix)}run (\d+) step (\d+) loss (\S+)$"
    for r, s, loss in re.findall(pattern, stdout, re.M):
        found.setdefault(int(r), {})[int(s)] = float(loss)
    return found


def _judge(code: int, out: str, err: str, ref: dict[int, float], first: str) -> str:
    """'ok', or what went wrong. `first`: how the launcher must name the first failure."""
    if code != 0:
        return f"exit code {code}"
    if not re.search(
        rf"^loadax-mesh launch: process 3 failed (first )?\({re.escape(first)}\)", err, re.M
    ):
        return "the first failure not named as process 3 with its own code"
    if "restart 1 of 1: the job again on 3 processes" not in err:
        return "not restarted on 3 processes"
    if f"[0] run 1: restored step {RESUMED}" not in out:
        return f"not resumed from step {RESUMED}"
    got = _losses(out, "[0] ").get(1, {})
    if sorted(got) != list(range(RESUMED + 1, STEPS + 1)):
        return f"run 1 trained steps {sorted(got)}"
    for step, loss in got.items():
        if abs(loss - ref[step]) > RTOL * abs(ref[step]):
            return f"step {step}: loss {loss!r}, uninterrupted {ref[step]!r}"
    return "ok"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 2)
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--kill", action="store_true", help="process 3 is SIGKILLed at step 3")
    how.add_argument("--in-save", action="store_true", help="killed inside step 4's save")
    args = parser.parse_args()
    if args.in_save:  # the checkpoint of step 4 is never committed: step 2's is the last
        die, first = ["--die-in-save", "4"], "signal 9"
    elif args.kill:
        die, first = ["--die-at", "3"], "signal 9"
    else:
        die, first = ["--die-at", "3", "--exit-code", "7"], "exit code 7"
    common = ["--steps", str(STEPS), "--save-every", str(SAVE_EVERY)]
    with tempfile.TemporaryDirectory() as tmp:
        code, out, err, took = _run([sys.executable, "elastic.py", "--ckpt", f"{tmp}/ref", *common])
        if code != 0:
            raise SystemExit(f"the uninterrupted run failed:\n{out}\n{err}")
        ref = _losses(out)[0]
        print(f"uninterrupted: {took:.0f} s, losses {[ref[s] for s in sorted(ref)]}", flush=True)
        hogs = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)
        ]
        good = 0
        try:
            for k in range(args.runs):
                cmd = [sys.executable, "-m", "loadax_mesh", "launch", *LAUNCH, "--"]
                cmd += [sys.executable, "elastic.py", "--ckpt", f"{tmp}/run{k}", *common, *die]
                code, out, err, took = _run(cmd)
                said = [line for line in err.splitlines() if line.startswith("loadax-mesh launch")]
                failed = next((line for line in said if " failed" in line), ": (no failure line)")
                verdict = _judge(code, out, err, ref, first)
                if verdict == "ok" and args.in_save and "killed inside the save" not in out:
                    verdict = "process 3 not killed inside the save"
                good += verdict == "ok"
                print(
                    f"run {k + 1}: {took:.0f} s, {verdict}; {failed.split(': ', 1)[1]}", flush=True
                )
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
    print(f"{good} of {args.runs} resumed with the uninterrupted losses")


if __name__ == "__main__":
    main()
