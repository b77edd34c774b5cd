"""`loadax-mesh` as a real process: simulated hardware never imports jax, even with
JAX_PLATFORMS=tpu on a machine without a TPU; errors exit 2 with one line; `python -m` works."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PLAN = ["plan", "tpu-v5p-512", "--strategy", "fsdp", "--global-batch", "1024"]


def cli() -> list[str]:
    script = Path(sys.executable).parent / "loadax-mesh"
    return [str(script)] if script.exists() else [sys.executable, "-m", "loadax_mesh"]


def run(cmd, **env):
    full = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    full.update({"JAX_PLATFORMS": "tpu", **env})
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(
    "argv",
    [
        PLAN,
        ["plan", "tpu-v5litepod-256-4", "--strategy", "hsdp", "--format", "json"],
        ["plan", "gpu-p5.48xlarge-256", "--strategy", "fsdp_tp"],
        ["hardware"],
        ["presets"],
    ],
)
def test_simulated_paths_never_import_jax(argv):
    probe = (
        "import sys\n"
        "from loadax_mesh.cli.main import main\n"
        f"code = main({argv!r})\n"
        "assert code == 0, code\n"
        "bad = sorted(m for m in sys.modules if m == 'jax' or m.startswith(('jax.', 'jaxlib')))\n"
        "print('JAX MODULES', bad, file=sys.stderr)\n"
    )
    done = run([sys.executable, "-c", probe])
    assert done.returncode == 0, done.stderr
    assert "JAX MODULES []" in done.stderr


def test_console_script_with_tpu_platform_and_no_tpu(tmp_path):
    svg = tmp_path / "grid.svg"
    done = run([*cli(), *PLAN, "--svg", str(svg)])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("hardware   tpu-v5p-512: TPU v5, 256 chips")
    assert "global batch 1024" in done.stdout and svg.stat().st_size > 0
    assert done.stderr == ""


def test_importtime_lists_no_jax():
    done = run([sys.executable, "-X", "importtime", "-m", "loadax_mesh", *PLAN])
    assert done.returncode == 0
    imported = [
        line.rsplit("|", 1)[-1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    ]
    assert "loadax_mesh.cli.main" in imported and "numpy" in imported
    assert not [m for m in imported if m == "jax" or m.startswith(("jax.", "jaxlib"))]


def test_python_m_json_and_error():
    done = run(
        [
            sys.executable,
            "-m",
            "loadax_mesh",
            "plan",
            "gpu-p5.48xlarge-256",
            "--strategy",
            "hsdp",
            "--format",
            "json",
        ]
    )
    assert done.returncode == 0
    assert json.loads(done.stdout)["hardware_summary"]["hosts"] == 32
    done = run([sys.executable, "-m", "loadax_mesh", "plan", "tpu-v5p-7", "--strategy", "fsdp"])
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("loadax-mesh: error: hardware='tpu-v5p-7'")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


@pytest.mark.slow
def test_local_devices_in_a_fresh_process():
    done = run(
        [*cli(), "plan", "--devices", "local", "--strategy", "dp", "--format", "json"],
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["hardware"] == "cpu-4" and data["shape"] == {"data": 4}


@pytest.mark.multiprocess
@pytest.mark.slow
def test_launch_then_plan_local_devices_of_the_whole_job():
    """`launch` delegates to loadax_mesh.jobs.launcher; `plan --devices local` in its children
    joins the job, so process 0 plans for both processes' devices."""
    done = run(
        [
            *cli(),
            "launch",
            "--nprocs",
            "2",
            "--devices-per-process",
            "2",
            "--",
            *cli(),
            "plan",
            "--devices",
            "local",
            "--strategy",
            "fsdp",
            "--global-batch",
            "8",
            "--format",
            "json",
        ],
        JAX_PLATFORMS="cpu",
    )
    assert done.returncode == 0, done.stderr
    lines = [line.split(" ", 1)[1] if " " in line else "" for line in done.stdout.splitlines()]
    assert all(line.startswith("[0]") for line in done.stdout.splitlines() if line.strip())
    data = json.loads("\n".join(lines))
    assert data["hardware"] == "cpu-2x2" and data["hardware_summary"]["hosts"] == 2
    assert [r["ranges"] for r in data["host_rows"]] == [[[0, 4]], [[4, 8]]]


@pytest.mark.slow
def test_local_devices_without_the_platform_is_one_line():
    done = run([*cli(), "plan", "--devices", "local", "--strategy", "fsdp"])  # tpu, no TPU
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("loadax-mesh: error: jax.devices() failed: ")
    assert done.stderr.count("\n") == 1
