"""A user's catalogue (load_catalogue, --catalogue, LOADAX_MESH_CATALOGUE) and the shipped DGX
entries: added types plan, estimate and are detected; overrides last one run; bad files are
refused naming file, entry and field."""

import re
from dataclasses import replace
from pathlib import Path

import pytest

from loadax_mesh import MeshConfig, MeshConfigError, estimate, load_catalogue, simulate_devices
from loadax_mesh.cli.main import main
from loadax_mesh.hardware.catalogue import catalogue
from loadax_mesh.hardware.detect import detect_hardware
from loadax_mesh.hardware.strings import parse_hardware
from loadax_mesh.hardware.user import ENV
from loadax_mesh.workload.model import ModelSpec
from loadax_mesh.workload.spec import TrainSpec
from tests.standins import gpu_nodes

EXAMPLE = Path(__file__).parents[2] / "examples" / "dgx_h100_cluster.toml"
ENTRY = EXAMPLE.read_text()


@pytest.fixture(autouse=True)
def _shipped(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    load_catalogue(None)
    yield
    load_catalogue(None)


def fact(key, name):
    return catalogue().get("gpu", key).fact(name)


def write(tmp_path, text, name="ours.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_user_type_plans_and_estimates():
    with pytest.raises(MeshConfigError, match="unknown GPU instance type 'our-dgx-h100'"):
        parse_hardware("gpu-our-dgx-h100-256")
    merged = load_catalogue(EXAMPLE)
    assert merged.user_file == str(EXAMPLE)
    assert merged.get("gpu", "our-dgx-h100").origin == str(EXAMPLE)
    assert merged.get("gpu", "p5.48xlarge").origin == "shipped"
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("gpu-our-dgx-h100-256"))
    assert plan.shape == {"data": 32, "fsdp": 8}
    est = estimate(plan, ModelSpec.from_name("llama3-8b"), TrainSpec(global_batch=256))
    assert est.fits and est.hardware == "gpu-our-dgx-h100-256" and 0 < est.mfu < 1


def test_an_override_lasts_until_cleared(tmp_path):
    before = (fact("p5.48xlarge", "network_per_gpu"), fact("p5.48xlarge", "hbm"))
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("gpu-p5.48xlarge-64"))
    model, train = ModelSpec.from_name("llama3-8b"), TrainSpec(global_batch=64)
    step = estimate(plan, model, train).step_seconds
    path = write(
        tmp_path,
        'schema = 1\n[sources]\nMINE = "our measurement"\n[gpu."p5.48xlarge"]\n'
        'network_per_gpu = { value = 50, unit = "Gbps", source = ["MINE"] }\n',
    )
    load_catalogue(path)
    assert fact("p5.48xlarge", "network_per_gpu").value == 50
    assert fact("p5.48xlarge", "network_per_gpu").source == ("MINE",)
    assert fact("p5.48xlarge", "hbm") == before[1]  # the other facts stay the shipped ones
    assert catalogue().get("gpu", "p5.48xlarge").origin == f"shipped + {path}"
    assert estimate(plan, model, train).step_seconds > step  # a slower network, a slower step
    load_catalogue(None)
    assert (fact("p5.48xlarge", "network_per_gpu"), fact("p5.48xlarge", "hbm")) == before
    assert before[0].value == 400 and estimate(plan, model, train).step_seconds == step


def test_the_environment_variable(monkeypatch):
    monkeypatch.setenv(ENV, str(EXAMPLE))
    assert parse_hardware("gpu-our-dgx-h100-16").hosts == 2
    assert fact("our-dgx-h100", "network_per_gpu").value == 350
    monkeypatch.delenv(ENV)
    with pytest.raises(MeshConfigError, match="unknown GPU instance type"):
        parse_hardware("gpu-our-dgx-h100-16")


def test_the_cli_flag_lists_where_entries_come_from(capsys):
    assert main(["hardware", "--catalogue", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("gpu-our-dgx-h100-<GPUs>"))
    assert line.rstrip().endswith(str(EXAMPLE)) and "350 Gbps" in line
    assert re.search(r"gpu-p5\.48xlarge-<GPUs> .* shipped$", out, re.MULTILINE)
    assert f"merged with {EXAMPLE}" in out
    assert (
        main(["plan", "gpu-our-dgx-h100-32", "--strategy", "fsdp", "--catalogue", str(EXAMPLE)])
        == 0
    )
    assert "data=4 x fsdp=8" in capsys.readouterr().out
    assert catalogue().get("gpu", "our-dgx-h100") is None  # for that run only
    assert main(["plan", "gpu-our-dgx-h100-32", "--strategy", "fsdp"]) == 2
    assert "unknown GPU instance type" in capsys.readouterr().err


def test_a_missing_fact_is_named_as_the_catalogue_names_it(tmp_path, capsys):
    lines = [x for x in ENTRY.splitlines() if not x.startswith("nvlink_latency")]
    path = write(tmp_path, "\n".join(lines) + "\n")
    argv = ["estimate", "gpu-our-dgx-h100-32", "--strategy", "fsdp", "--model", "llama3-8b"]
    argv += ["--global-batch", "32", "--catalogue", path]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "the catalogue has no nvlink_latency for it" in err, err
    assert "--fact nvlink_latency=VALUE" in err
    assert "ici" not in err and ".py" not in err and ".toml" not in err  # the GPU's word, no source
    assert main([*argv, "--fact", "nvlink_latency=1us"]) == 0, capsys.readouterr().err
    assert "nvlink_latency = 1 us (given by the user)" in capsys.readouterr().out


def test_detection_names_the_users_types(tmp_path):
    new_kind = ENTRY.replace(
        "NVIDIA H100 80GB HBM3", "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    )
    assert detect_hardware(gpu_nodes(2)) == "gpu-p5.48xlarge-16"
    load_catalogue(EXAMPLE)  # the H100's kind: the user's type is named before the shipped ones
    assert detect_hardware(gpu_nodes(2)) == "gpu-our-dgx-h100-16"
    load_catalogue(write(tmp_path, new_kind.replace("our-dgx-h100", "our-rtx")))
    kind = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert detect_hardware(gpu_nodes(4, kind=kind)) == "gpu-our-rtx-32"


BROKEN = {  # what is changed in the example -> the field the error names, and what it says
    "unknown field": ("hbm = {", "hbm_size = {", "hbm_size", "unknown field"),
    "unknown fact key": (
        'source = ["OURS"] }\nhost_memory',
        'sourse = ["OURS"] }\nhost_memory',
        "hbm",
        "unknown key 'sourse'",
    ),
    "missing source": (
        'hbm = { value = 80, unit = "GB", source = ["OURS"] }',
        'hbm = { value = 80, unit = "GB" }',
        "hbm",
        "source",
    ),
    "unknown source key": (
        'source = ["OURS-NCCL"], note',
        'source = ["THEIRS"], note',
        "network_per_gpu",
        "'THEIRS'",
    ),
    "negative bandwidth": ("value = 3350,", "value = -3350,", "hbm_bandwidth", "positive number"),
    "non-numeric value": ("value = 3350,", 'value = "fast",', "hbm_bandwidth", "positive number"),
    "bad unit": (
        'value = 3350, unit = "GB/s"',
        'value = 3350, unit = "GB"',
        "hbm_bandwidth",
        "GB/s, Gbps",
    ),
    "missing field": (
        'gpus_per_host = { value = 8, source = ["OURS"] }\n',
        "",
        "gpus_per_host",
        "missing",
    ),
    "share above 1": ("value = 0.69,", "value = 69,", "matmul_share", "(0, 1]"),
    "low-precision peak in a wrong unit": (
        "matmul_share = {",
        'peak_fp8 = { value = 1979, unit = "GB/s", source = ["OURS"] }\nmatmul_share = {',
        "peak_fp8",
        "TFLOPs",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_files_are_refused_naming_file_entry_and_field(tmp_path, case):
    old, new, field, says = BROKEN[case]
    assert old in ENTRY
    path = write(tmp_path, ENTRY.replace(old, new, 1))
    with pytest.raises(MeshConfigError) as err:
        load_catalogue(path)
    text = str(err.value)
    assert path in text and "gpu.our-dgx-h100" in text and field in text and says in text, text
    assert catalogue().user_file is None  # a refused file leaves the catalogue as it was
    assert main(["hardware", "--catalogue", path]) == 2


@pytest.mark.parametrize(
    "text, says",
    [
        ('[gpu.x]\ntitle = "x"\n', "schema=None"),
        ("schema = 1\n[cpu]\ntitle = 'x'\n", "unknown table 'cpu'"),
        ('schema = 1\n[sources]\nN-h100 = "mine"\n', "sources.N-h100 is a shipped source key"),
        ("schema = 1\n[gpu\n", "is no TOML"),
    ],
)
def test_broken_files_are_refused_at_the_top(tmp_path, text, says):
    path = write(tmp_path, text)
    with pytest.raises(MeshConfigError, match=re.escape(says)) as err:
        load_catalogue(path)
    assert path in str(err.value)


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(MeshConfigError, match=r"no-such\.toml"):
        load_catalogue(tmp_path / "no-such.toml")


def test_a_user_entry_gives_its_low_precision_peaks(tmp_path):
    """The example entry has no fp8 peak: fp8 is refused by name; with one (and a measured
    share of it) it prices, and a measured share outside (0, 1] is refused."""
    load_catalogue(EXAMPLE)
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("gpu-our-dgx-h100-16"))
    model, train = ModelSpec.from_name("llama3-8b"), TrainSpec(global_batch=16)
    with pytest.raises(MeshConfigError, match=r"quantization='fp8'.*no peak_fp8"):
        estimate(plan, model, replace(train, quantization="fp8"))
    peaks = (
        'peak_fp8 = { value = 1979, unit = "TFLOPs", source = ["OURS"] }\n'
        'fp8_matmul_share = { value = 0.6, source = ["OURS"] }\nmatmul_share = {'
    )
    load_catalogue(write(tmp_path, ENTRY.replace("matmul_share = {", peaks, 1)))
    facts = parse_hardware("gpu-our-dgx-h100-16").fact("peak_fp8")
    assert (facts.value, facts.unit, facts.source) == (1979, "TFLOPs", ("OURS",))
    bf16 = estimate(plan, model, train)
    fp8 = estimate(plan, model, replace(train, quantization="fp8"))
    assert fp8.step_seconds < bf16.step_seconds and fp8.assumes == ()
    broken = ENTRY.replace("matmul_share = {", peaks.replace("0.6,", "1.6,"), 1)
    with pytest.raises(MeshConfigError, match=r"fp8_matmul_share.*\(0, 1\]"):
        load_catalogue(write(tmp_path, broken, "broken.toml"))


def test_the_shipped_numbers_are_unchanged():
    v5p = catalogue().get("tpu", "v5p")
    assert (v5p.fact("hbm").value, v5p.fact("hbm").unit, v5p.counts[-1]) == (95, "GiB", 17920)
    assert fact("p5.48xlarge", "network_per_gpu").value == 400
    assert fact("a4x-highgpu-4g", "nvlink_domain").value == 72
    assert fact("p5e.48xlarge", "grouped_matmul_share").value == 0.455
    load_catalogue(EXAMPLE)
    assert catalogue().get("tpu", "v5p") == v5p and fact("p5.48xlarge", "hbm").value == 80


@pytest.mark.parametrize(
    "hardware, shape, per_gpu",
    [
        ("gpu-dgx-h100-32", {"data": 4, "fsdp": 8}, 400),
        ("gpu-dgx-h200-16", {"data": 2, "fsdp": 8}, 400),
        ("gpu-dgx-b200-64", {"data": 8, "fsdp": 8}, 400),
        ("gpu-gb200-nvl72-144", {"data": 18, "fsdp": 8}, 400),
    ],
)
def test_the_dgx_entries_plan_and_estimate(hardware, shape, per_gpu):
    spec = parse_hardware(hardware)
    assert spec.fact("network_per_gpu").value == per_gpu
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices(hardware), selector=hardware)
    assert plan.shape == shape
    est = estimate(plan, ModelSpec.from_name("llama3-8b"), TrainSpec(global_batch=spec.chips))
    assert est.fits and 0 < est.mfu < 1


def test_the_dgx_h100_string_on_the_command_line(capsys):
    assert main(["plan", "gpu-dgx-h100-32", "--strategy", "fsdp"]) == 0
    assert "data=4 x fsdp=8" in capsys.readouterr().out
    argv = ["estimate", "gpu-dgx-h100-32", "--strategy", "fsdp", "--model", "llama3-8b"]
    assert main([*argv, "--global-batch", "32"]) == 0
    assert ": fits" in capsys.readouterr().out


@pytest.mark.compile
@pytest.mark.slow
def test_a_user_type_compiles_on_the_cuda_client(capsys):
    """Four nodes of the user's DGX H100 entry: XLA's CUDA client compiles the step for them
    (the GPU's target config is found by the entry's device_kind)."""
    argv = ["compile", "gpu-our-dgx-h100-32", "--catalogue", str(EXAMPLE), "--strategy", "fsdp"]
    assert main([*argv, "--model", "tiny", "--global-batch", "32"]) == 0
    out = capsys.readouterr().out
    assert "mesh data=4 x fsdp=8" in out and ": fits" in out
