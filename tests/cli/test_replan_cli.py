"""`loadax-mesh replan HARDWARE --lose host:N|slice:N`: replan's answer for simulated hardware."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loadax_mesh import MeshConfig, replan, simulate_devices
from loadax_mesh.cli.main import main
from tests.helpers import run_python

HSDP = ["--shape", "1,-1", "--dcn-shape", "-1,1", "--axes", "replicate,shard"]
HSDP += ["--batch-axes", "replicate,shard"]


def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_host_lost_from_a_multislice_job(capsys: Any) -> None:
    argv = ["replan", "tpu-v5litepod-256-4", *HSDP, "--global-batch", "3072", "--lose", "host:70"]
    code, out, _ = run(capsys, *argv)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("before     tpu-v5litepod-256-4: replicate=4 x shard=256 on 1024")
    assert lines[0].endswith("budget 3 rows a device")
    assert lines[1] == "lost       host 70: 4 devices"
    assert lines[2].startswith("dropped    slice 1: 252 devices left idle")
    assert lines[3] == "after      replicate=3 x shard=256 on 768 devices, data-parallel degree 768"
    assert lines[4] == (
        "batch      global batch 3072 kept: 2 micro-batches of 1536 rows, 2 rows a device"
    )
    assert "hardware   tpu-v5litepod-256-3:" in out  # the plan's report on what is left
    assert "global batch 3072: 4 rows per shard; 192 hosts loading 16 rows each" in out


def test_json_agrees_with_the_api(capsys: Any) -> None:
    argv = ["replan", "gpu-p5.48xlarge-32", "--shape", "-1", "--axes", "fsdp", "--format", "json"]
    code, out, _ = run(capsys, *argv, "--global-batch", "96", "--lose", "slice:1")
    data = json.loads(out)
    devices = [d for d in simulate_devices("gpu-p5.48xlarge-32") if d.slice_index != 1]
    config = MeshConfig((-1,), ("fsdp",), "fsdp")
    want = replan(config, devices, global_batch=96, rows_per_device=3)
    assert code == 0 and data["rows_per_device_budget"] == 3  # 96 rows on 32 GPUs
    assert data["microbatches"] == want.microbatches == 2 and data["rows_per_device"] == 2
    assert data["plan"]["shape"] == {"fsdp": 24} and data["dropped_devices"] == []
    assert data["before"] == {"shape": {"fsdp": 32}, "data_parallel_size": 32}


def test_rows_per_device_can_be_given(capsys: Any) -> None:
    argv = ["replan", "cpu-4x2", "--shape", "-1,2", "--axes", "data,model", "--lose", "host:3"]
    code, out, _ = run(capsys, *argv, "--global-batch", "12", "--rows-per-device", "4")
    assert code == 0 and "global batch 12 kept: 1 micro-batch of 12 rows, 4 rows a device" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--lose", "host:9"], "--lose host:9: there is no host 9; accepted: host 0 to 3"),
        (["--lose", "rack:1"], "accepted: host:N or slice:N"),
        (["--lose", "host:1", "--global-batch", "10"], "multiple of 8"),
        (["--lose", "host:1", "--global-batch", "16"], "does not divide by the data-parallel"),
        (["--lose", "host:1"], "replan needs --global-batch"),
    ],
)
def test_errors_say_what_would_work(capsys: Any, extra: list[str], message: str) -> None:
    argv = ["replan", "cpu-4x2", "--shape", "-1", "--axes", "data"]
    if "--global-batch" not in extra and "needs" not in message:
        extra = [*extra, "--global-batch", "8"]
    code, _, err = run(capsys, *argv, *extra)
    assert code == 2 and err.startswith("loadax-mesh: error: ")
    assert message in err


def test_replan_cli_imports_no_jax() -> None:
    code = (
        "import sys\nfrom loadax_mesh.cli.main import main\n"
        "assert main(['replan', 'tpu-v5p-512-2', '--shape', '-1', '--axes', 'data',"
        " '--global-batch', '512', '--lose', 'host:3']) == 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'jax'))"
    )
    assert run_python(code).splitlines()[-1] == "[]"
