"""The wheel ships configs/: a non-editable install reads the catalogue and presets from itself."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, sys
import loadax_mesh as lm
from loadax_mesh._configs import config_path
from loadax_mesh.hardware.strings import list_hardware, parse_hardware
spec = parse_hardware("tpu-v5p-512")
plan = lm.MeshConfig.from_preset("fsdp_tp", tp=8).plan(lm.simulate_devices("tpu-v5p-512"))
print(json.dumps({
    "module": lm.__file__,
    "catalogue": str(config_path("hardware.toml")),
    "preset_dir": str(config_path("presets")),
    "types": [t.key for t in list_hardware()],
    "chips": spec.chips, "hosts": spec.hosts, "topology": list(spec.topology),
    "presets": lm.list_presets(),
    "shape": plan.shape, "hardware": plan.hardware,
    "jax": "jax" in sys.modules,
}))
"""


@pytest.mark.slow
def test_wheel_ships_configs(tmp_path):
    dist, target, elsewhere = tmp_path / "dist", tmp_path / "site", tmp_path / "cwd"
    elsewhere.mkdir()
    # Build with the venv's hatchling when present (works offline), else in isolation.
    isolation = ["--no-isolation"] if importlib.util.find_spec("hatchling") else []
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", *isolation, "--outdir", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = dist.glob("loadax_mesh-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "loadax_mesh/configs/hardware.toml" in names
    assert {f"loadax_mesh/configs/presets/{p}.toml" for p in ("fsdp", "hsdp", "dp_sp")} <= set(
        names
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=elsewhere,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    got = json.loads(out.stdout)
    for key in ("module", "catalogue", "preset_dir"):
        assert Path(got[key]).is_relative_to(target), (key, got[key])
    assert {"v4", "v5litepod", "v5p", "v6e", "7x", "p5.48xlarge", "cpu"} <= set(got["types"])
    assert (got["chips"], got["hosts"], got["topology"]) == (256, 64, [4, 8, 8])
    assert got["presets"] == [
        "dp",
        "dp_sp",
        "fsdp",
        "fsdp_ep",
        "fsdp_tp",
        "hsdp",
        "pipeline_fsdp_tp",
    ]
    assert got["shape"] == {"data": 1, "fsdp": 32, "model": 8}
    assert got["hardware"] == "tpu-v5p-512" and got["jax"] is False
