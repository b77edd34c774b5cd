"""`loadax-mesh` in-process: plan (text, JSON, SVG), hardware, presets, devices, launch, errors."""

import json
import math
import re
import xml.etree.ElementTree as ET

import pytest

from loadax_mesh import MeshConfig, list_presets, simulate_devices
from loadax_mesh.cli.main import main
from loadax_mesh.view.report import hardware_summary


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def expected_plan(hardware, strategy):
    """The same plan through the library API, to compare the CLI against."""
    return MeshConfig.from_preset(strategy).plan(simulate_devices(hardware), selector=hardware)


def table_line(text, axis):
    return next(x.split() for x in text.splitlines() if re.match(rf"\s+{axis}( \*)?\s+\d", x))


# -- plan: text -------------------------------------------------------------------------------
CASES = [
    ("tpu-v5p-512", "fsdp"),
    ("tpu-v5litepod-256-4", "hsdp"),
    ("gpu-p5.48xlarge-256", "fsdp"),
    ("gpu-p5.48xlarge-256", "hsdp"),
]


@pytest.mark.parametrize(("hardware", "strategy"), CASES)
def test_plan_text(capsys, hardware, strategy):
    code, out, err = run(capsys, "plan", hardware, "--strategy", strategy)
    assert (code, err) == (0, "")
    plan = expected_plan(hardware, strategy)
    hw = hardware_summary(plan)
    assert out.startswith(f"hardware   {hardware}: {hw['device_kind']}, ")
    assert f"{hw['hosts']} hosts" in out.splitlines()[0]
    assert "mesh       " + " x ".join(f"{a}={s}" for a, s in plan.shape.items()) in out
    for name, q in plan.quality().items():
        cols = table_line(out, name)
        sizes = cols[2:5] if cols[1] == "*" else cols[1:4]
        assert sizes == [str(q.size), str(q.ici), str(q.dcn)]
        assert f"{q.efficiency:.3f}" in cols and f"{q.ring_steps}/{q.hops}" in cols
    assert f"data-parallel degree {plan.data_parallel_size}" in out
    assert re.search(rf"note       preset {strategy}: (rule '.*' matches|none of its)", out)
    assert "\x1b[" not in out  # captured stdout is no terminal
    assert re.search(r"^grid: \d+ lines x \d+ devices in mesh order", out, re.M)


def test_plan_text_tpu_facts(capsys):
    code, out, _ = run(capsys, "plan", "tpu-v5p-512", "--strategy", "fsdp")
    assert code == 0
    assert "256 chips (1 device each), 64 hosts, 1 slice" in out
    assert "topology   4x8x8 chips" in out


def test_plan_text_multislice_and_gpu_facts(capsys):
    _, out, _ = run(capsys, "plan", "tpu-v5litepod-256-4", "--strategy", "hsdp")
    assert "1024 chips" in out and "4 slices" in out and "16x16 chips per slice" in out
    assert "mark the slice" in out and re.search(r"^\s+-{20,}$", out, re.M)
    _, out, _ = run(capsys, "plan", "gpu-p5.48xlarge-256", "--strategy", "hsdp")
    assert "256 GPUs, 32 hosts" in out and "8 GPUs per host" in out


def test_plan_global_batch_rows(capsys):
    code, out, _ = run(
        capsys, "plan", "gpu-p5.48xlarge-256", "--strategy", "hsdp", "--global-batch", "512"
    )
    assert code == 0
    plan = expected_plan("gpu-p5.48xlarge-256", "hsdp")
    per_shard = 512 // plan.data_parallel_size
    assert f"global batch 512: {per_shard} rows per shard; 32 hosts loading" in out
    assert re.search(r"rows 0:\d+ +hosts? 0\b", out)


def test_plan_color_always(capsys):
    _, out, _ = run(
        capsys, "plan", "tpu-v5litepod-256-4", "--strategy", "hsdp", "--color", "always"
    )
    assert out.count("\x1b[0m") == 1024 and "more lines" not in out
    assert re.search(r"\x1b\[(97;4|30;10)[1-6]m", out)


# -- plan: JSON -------------------------------------------------------------------------------
KEYS = {
    "axis_names",
    "ici_mesh_shape",
    "dcn_mesh_shape",
    "shape",
    "hardware",
    "batch_axis_names",
    "quality",
    "devices",
}


@pytest.mark.parametrize(("hardware", "strategy"), CASES)
def test_plan_json(capsys, hardware, strategy):
    code, out, err = run(capsys, "plan", hardware, "--strategy", strategy, "--format", "json")
    assert (code, err) == (0, "")
    data = json.loads(out)
    assert set(data) >= KEYS
    expected = expected_plan(hardware, strategy).to_dict()
    assert {k: data[k] for k in expected} == json.loads(json.dumps(expected))
    assert data["hardware"] == hardware
    devices = simulate_devices(hardware)
    summary = data["hardware_summary"]
    assert summary["devices"] == len(devices)
    assert summary["hosts"] == len({d.process_index for d in devices})
    assert summary["slices"] == len({d.slice_index for d in devices})
    assert sorted(_flat(data["devices"])) == sorted(d.id for d in devices)
    assert data["strategy"] == strategy and data["host_rows"] is None


def _flat(nested):
    if isinstance(nested, list):
        for x in nested:
            yield from _flat(x)
    else:
        yield nested


def test_plan_json_host_rows_cover_the_batch(capsys):
    code, out, _ = run(
        capsys,
        "plan",
        "tpu-v5p-512",
        "--strategy",
        "fsdp",
        "--global-batch",
        "1024",
        "--format",
        "json",
    )
    assert code == 0
    data = json.loads(out)
    rows = data["host_rows"]
    assert [r["host"] for r in rows] == list(range(64))
    distinct = {tuple(map(tuple, r["ranges"])) for r in rows}
    # each distinct row set is loaded by hosts that share it; together they cover the batch
    assert sorted(x for s in distinct for a, b in s for x in range(a, b)) == list(range(1024))
    by_index = {}
    for r in rows:
        by_index.setdefault(r["shard_index"], set()).add(tuple(map(tuple, r["ranges"])))
    assert all(len(v) == 1 for v in by_index.values()) and len(by_index) == len(distinct)
    assert {r["num_shards"] for r in rows} == {len(distinct)}


def test_plan_svg_parses(capsys, tmp_path):
    path = tmp_path / "grid.svg"
    code, out, _ = run(
        capsys, "plan", "tpu-v5litepod-256-4", "--strategy", "hsdp", "--svg", str(path)
    )
    assert code == 0 and f"wrote {path}" in out
    root = ET.parse(path).getroot()
    rects = root.findall(".//{http://www.w3.org/2000/svg}rect")
    assert len(rects) == 1024


# -- plan: shapes and the note that says where the shape came from -----------------------------
def test_plan_explicit_shape(capsys):
    code, out, _ = run(
        capsys,
        "plan",
        "tpu-v5p-512",
        "--shape",
        "-1,4",
        "--axes",
        "fsdp,model",
        "--batch-axes",
        "fsdp",
    )
    assert code == 0
    assert "note       shape (-1, 4) from --shape" in out
    assert "mesh       fsdp=64 x model=4" in out


def test_plan_hybrid_shape(capsys):
    code, out, _ = run(
        capsys,
        "plan",
        "tpu-v5litepod-256-4",
        "--shape",
        "16,16",
        "--dcn-shape",
        "4,1",
        "--axes",
        "data,model",
        "--format",
        "json",
    )
    assert code == 0
    data = json.loads(out)
    assert (data["ici_mesh_shape"], data["dcn_mesh_shape"]) == ([16, 16], [4, 1])
    assert data["batch_axis_names"] == ["data"]


def test_plan_preset_override(capsys):
    code, out, _ = run(
        capsys, "plan", "tpu-v5p-512", "--strategy", "fsdp_tp", "--set", "tp=8", "--format", "json"
    )
    assert code == 0
    data = json.loads(out)
    expected = MeshConfig.from_preset("fsdp_tp", tp=8).plan(
        simulate_devices("tpu-v5p-512"), selector="tpu-v5p-512"
    )
    assert data["shape"] == expected.shape and data["shape"]["model"] == 8
    assert data["devices"] == expected.to_dict()["devices"]


def test_a_preset_shape_that_fails_after_an_override_names_the_override(capsys):
    code, _, err = run(capsys, "plan", "tpu-v5p-512", "--strategy", "fsdp", "--set", "fsdp=3")
    assert code == 2 and "does not divide 256" in err and "after --set fsdp=3" in err


def test_plan_shape_with_a_strategy_keeps_its_axes(capsys):
    code, out, _ = run(
        capsys,
        "plan",
        "tpu-v5p-512",
        "--strategy",
        "fsdp_tp",
        "--shape",
        "2,-1,4",
        "--format",
        "json",
    )
    assert code == 0
    data = json.loads(out)
    assert data["shape"] == {"data": 2, "fsdp": 32, "model": 4}
    assert data["batch_axis_names"] == ["data", "fsdp"]
    assert data["notes"][0] == "shape (2, -1, 4) from --shape"


def test_plan_without_matching_rule_says_which_shape(capsys, monkeypatch):
    # Every shipped preset covers every platform, so a stand-in preset with a GPU rule only.
    config = MeshConfig((-1, 2), ("data", "model"), "data", (("gpu-.+", (-1, 8)),))
    monkeypatch.setattr(MeshConfig, "from_preset", classmethod(lambda cls, name: config))
    code, out, _ = run(capsys, "plan", "cpu-8", "--strategy", "gpu_only")
    assert code == 0
    assert (
        "note       preset gpu_only: none of its 1 mesh rules matches cpu-8, so its default "
        "shape (-1, 2) is used"
    ) in out
    assert "mesh       data=4 x model=2" in out
    code, out, _ = run(capsys, "plan", "gpu-p5.48xlarge-16", "--strategy", "gpu_only")
    assert "rule 'gpu-.+' matches gpu-p5.48xlarge-16, shape (-1, 8)" in out


def test_plan_split_warning_becomes_a_note(capsys):
    code, out, err = run(
        capsys, "plan", "tpu-v5litepod-256-4", "--shape", "2,-1", "--axes", "data,fsdp"
    )
    assert (code, err) == (0, "")
    assert re.search(r"note       mesh_shape=\(2, 512\) over 4 granules", out)


# -- hardware, presets --------------------------------------------------------------------------
def test_presets_lists_every_preset(capsys):
    code, out, _ = run(capsys, "presets")
    assert code == 0
    for name in list_presets():
        config = MeshConfig.from_preset(name)
        line = next(x for x in out.splitlines() if x.split()[:1] == [name])
        assert ", ".join(config.mesh_axis_names) in line
        for regex, _ in config.mesh_rules or ():
            assert regex in out
    code, out, _ = run(capsys, "presets", "--format", "json")
    data = json.loads(out)
    assert sorted(data) == sorted(list_presets())
    assert data["hsdp"]["mesh_axis_names"] == ["replicate", "shard"]


def test_hardware_table(capsys):
    code, out, _ = run(capsys, "hardware")
    assert code == 0
    for word in ("v5p", "v5litepod", "v6e", "7x", "p5.48xlarge", "a3-megagpu-8g", "cpu"):
        assert word in out
    code, out, _ = run(capsys, "hardware", "--format", "json")
    v5p = next(t for t in json.loads(out) if t["key"] == "v5p")
    assert v5p["facts"]["dcn_bandwidth"]["value"] == 50 and v5p["facts"]["dcn_bandwidth"]["source"]
    assert [4, 8, 8] in [t["shape"] for t in v5p["topologies"]]


# -- local devices (the 8 CPU devices of tests/conftest.py) --------------------------------------
def test_plan_local_devices(capsys):
    import jax

    code, out, err = run(capsys, "plan", "--devices", "local", "--strategy", "fsdp")
    assert (code, err) == (0, "")
    assert out.startswith("hardware   cpu-8: cpu, 8 devices, 1 process")
    assert "built jax.sharding.Mesh" in out
    code, out, _ = run(
        capsys,
        "plan",
        "--devices",
        "local",
        "--shape",
        "2,4",
        "--axes",
        "data,model",
        "--global-batch",
        "8",
        "--format",
        "json",
    )
    data = json.loads(out)
    assert data["hardware"] == "cpu-8" and data["shape"] == {"data": 2, "model": 4}
    assert sorted(_flat(data["devices"])) == sorted(d.id for d in jax.devices())
    assert data["host_rows"] == [
        {"host": 0, "ranges": [[0, 8]], "num_rows": 8, "shard_index": 0, "num_shards": 1}
    ]


def test_devices_command(capsys):
    code, out, _ = run(capsys, "devices")
    assert code == 0 and out.startswith("hardware cpu-8: 8 devices, process 0 of 1")
    assert len([x for x in out.splitlines() if re.match(r"\d+\s+cpu\s", x)]) == 8
    data = json.loads(run(capsys, "devices", "--format", "json")[1])
    assert data["hardware"] == "cpu-8" and [d["id"] for d in data["devices"]] == list(range(8))


# -- launch delegates -----------------------------------------------------------------------------
def test_launch_hands_the_rest_to_the_launcher(monkeypatch):
    import loadax_mesh.jobs.launcher as launcher

    seen = []
    monkeypatch.setattr(launcher, "main", lambda argv: seen.append(argv) or 7)
    argv = ["--nprocs", "2", "--devices-per-process", "4", "--", "python", "x.py", "--plan"]
    assert main(["launch", *argv]) == 7
    assert seen == [argv]


# -- errors: one line on stderr, exit code 2 ------------------------------------------------------
BAD = [
    ["plan", "tpu-v9-512", "--strategy", "fsdp"],
    ["plan", "tpu-v5p-513", "--strategy", "fsdp"],
    ["plan", "gpu-p5.48xlarge-12", "--strategy", "fsdp"],
    ["plan", "banana", "--strategy", "fsdp"],
    ["plan", "tpu-v5p-512", "--strategy", "nope"],
    ["plan", "tpu-v5p-512", "--shape", "16.5,4", "--axes", "a,b"],
    ["plan", "tpu-v5p-512", "--shape", "16,4", "--axes", "a,b"],
    ["plan", "tpu-v5p-512", "--shape", "-1,4", "--axes", "a,a"],
    ["plan", "tpu-v5p-512", "--shape", "-1,4"],
    ["plan", "tpu-v5p-512", "--axes", "a,b", "--strategy", "fsdp"],
    ["plan", "tpu-v5p-512"],
    ["plan", "--strategy", "fsdp"],
    ["plan", "tpu-v5p-512", "--devices", "local", "--strategy", "fsdp"],
    ["plan", "tpu-v5p-512", "--strategy", "fsdp", "--global-batch", "100"],
    ["plan", "tpu-v5p-512", "--strategy", "fsdp", "--global-batch", "0"],
    ["plan", "tpu-v5p-512", "--strategy", "fsdp", "--format", "yaml"],
    ["plan", "tpu-v5p-512", "--strategy", "fsdp", "--batch-axes", "nope"],
    ["plan", "tpu-v5p-512", "--strategy", "fsdp", "--svg", "/nonexistent/dir/x.svg"],
    ["plan", "tpu-v5p-512", "--strategy", "fsdp", "--set", "tp"],
    ["frobnicate"],
    [],
]


@pytest.mark.parametrize("argv", BAD, ids=lambda a: " ".join(a) or "nothing")
def test_errors_are_one_line_and_exit_2(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.startswith("loadax-mesh: error: ") and err.endswith("\n")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_error_names_the_bad_value(capsys):
    err = run(capsys, "plan", "tpu-v9-512", "--strategy", "fsdp")[2]
    assert "tpu-v9-512" in err
    err = run(capsys, "plan", "tpu-v5p-512", "--shape", "16.5,4", "--axes", "a,b")[2]
    assert "'16.5' is not an integer" in err
    err = run(capsys, "plan", "tpu-v5p-512", "--strategy", "fsdp", "--global-batch", "100")[2]
    assert "global_batch=100" in err and "degree" in err


def test_help_exits_0(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "plan" in out and "launch" in out
    code, out, _ = run(capsys, "plan", "--help")
    assert code == 0 and "--global-batch" in out


def test_plan_sizes_match_devices(capsys):
    for hardware, strategy in CASES:
        data = json.loads(
            run(capsys, "plan", hardware, "--strategy", strategy, "--format", "json")[1]
        )
        assert math.prod(data["shape"].values()) == len(simulate_devices(hardware))


def test_shape_takes_commas_only(capsys):
    from loadax_mesh.cli.main import main

    assert main(["plan", "tpu-v5p-512", "--shape", "16x16", "--axes", "a,b"]) == 2
    assert "'16x16' is not an integer" in capsys.readouterr().err


@pytest.mark.slow
def test_compile_local_cpu_says_its_memory_is_not_judged(capsys):
    code, out, _ = run(
        capsys,
        *("compile", "--devices", "local", "--strategy", "fsdp"),
        *("--model", "tiny", "--global-batch", "8"),
    )
    assert code == 0
    memory = next(line for line in out.splitlines() if line.startswith("memory"))
    assert "not judged (CPU devices share the host's memory" in memory
    assert "?" not in memory and "unknown" not in memory


def test_a_compile_on_a_terminal_counts_seconds(monkeypatch):
    """On a TTY the progress line is redrawn with the seconds so far while XLA works."""
    import io
    import threading

    from loadax_mesh.cli.compile import _progress

    ticked = threading.Event()

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

        def write(self, text: str) -> int:
            if text.startswith("\r") and " s" in text:
                ticked.set()
            return super().write(text)

    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    with _progress("compiling tiny for cpu-8"):
        assert ticked.wait(30)  # the body runs until the line has been drawn once
    assert re.search(r"\r. compiling tiny for cpu-8: \d+ s", terminal.getvalue())
    assert terminal.getvalue().endswith("\r\033[K")  # the line is cleared when done


def test_a_compile_the_compiler_fails_is_one_error_line(capsys, monkeypatch):
    """XLA's failure (here a custom partitioner's, as jax reports it inside XLA's error) is
    one `loadax-mesh: error:` line naming the plan and the reason, exit code 1."""
    import jax

    from loadax_mesh.compiler import report

    inner = (
        "INTERNAL: custom_partitioner: Traceback (most recent call last):\n"
        '  File "fused_attention_stablehlo.py", line 924, in _check_qkv_bias_mask_spec\n'
        "ValueError: Query, key and value should have same sharding.\n\n"
        "Suspected Python Code Location:\n  step.py:129:23 [Step.fn.<locals>.step]"
    )

    def fails(*_, **__):
        raise jax.errors.JaxRuntimeError(inner)

    monkeypatch.setattr(report, "compile_step", fails)
    code, out, err = run(
        capsys,
        *("compile", "--devices", "local", "--shape", "4,2", "--axes", "fsdp,seq"),
        *("--batch-axes", "fsdp", "--model", "tiny", "--global-batch", "8"),
    )
    assert code == 1 and out == ""
    lines = [line for line in err.splitlines() if line.startswith("loadax-mesh:")]
    assert lines == [
        "loadax-mesh: error: compiling tiny (seq_len 128) for cpu-8 on the mesh fsdp 4 x seq 2 "
        "failed: ValueError: Query, key and value should have same sharding."
    ], err
    assert "Traceback" not in err
