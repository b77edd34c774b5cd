"""How fast `loadax-mesh plan HARDWARE ...` answers, against a bare `python -c "import jax"`.

Planning simulated hardware goes through the pure core and never imports jax, so the whole
command should take at most half of what importing jax alone takes (docs/design.md section 4). Both
are timed in this one run as subprocess wall time, interleaved, median of several runs each.

    python benchmarks/bench_cli.py [--runs 9]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET = 0.5
CASES = [
    ["plan", "tpu-v5p-512", "--strategy", "fsdp"],
    ["plan", "tpu-v5p-512", "--strategy", "fsdp", "--global-batch", "1024", "--format", "json"],
    ["plan", "tpu-v5litepod-256-4", "--strategy", "hsdp"],
    ["plan", "gpu-p5.48xlarge-256", "--strategy", "fsdp_tp", "--global-batch", "512"],
    ["hardware"],
]


def _cli() -> list[str]:
    """The installed console script next to this interpreter, else `python -m loadax_mesh`."""
    script = Path(sys.executable).parent / "loadax-mesh"
    if script.exists():
        return [str(script)]
    found = shutil.which("loadax-mesh")
    return [found] if found else [sys.executable, "-m", "loadax_mesh"]


def _time(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    # No accelerator is needed, and none is touched: TPU would fail if jax got imported.
    env = {**os.environ, "JAX_PLATFORMS": "tpu"}
    jax_cmd = [sys.executable, "-c", "import jax"]
    python_cmd = [sys.executable, "-c", "pass"]
    commands = [python_cmd, jax_cmd, *([*_cli(), *case] for case in CASES)]
    for cmd in commands:  # warm the file cache and check every command works
        _time(cmd, env)
    times: list[list[float]] = [[] for _ in commands]
    for _ in range(args.runs):
        for i, cmd in enumerate(commands):
            times[i].append(_time(cmd, env))
    median = [statistics.median(t) for t in times]
    jax_s = median[1]
    print(
        f"python {sys.version.split()[0]}, {args.runs} runs each (median wall time, "
        f"subprocess), cli = {' '.join(_cli())}"
    )
    print(f"{'command':<78} {'median s':>9} {'vs import jax':>14}")
    labels = [
        'python -c "pass"',
        'python -c "import jax"',
        *(f"loadax-mesh {' '.join(c)}" for c in CASES),
    ]
    for label, m in zip(labels, median, strict=True):
        print(f"{label:<78} {m:>9.3f} {m / jax_s:>14.2f}")
    worst = max(median[2:]) / jax_s
    verdict = "meets" if worst <= TARGET else "MISSES"
    print(f"worst loadax-mesh / import jax = {worst:.2f} ({verdict} the target <= {TARGET})")


if __name__ == "__main__":
    main()
