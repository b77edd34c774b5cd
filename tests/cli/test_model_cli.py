"""`--model` as a catalogue name or a model file, `--seq-len`, and `models --model FILE`: each
report names the model and the sequence length it priced or compiled."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from loadax_mesh import MeshConfig, choose_mesh, simulate_devices
from loadax_mesh.cli.main import main
from loadax_mesh.cost import estimate
from loadax_mesh.workload import ModelSpec, TrainSpec
from tests.workload.test_model_files import GPT_OSS_120B, LLAMA3_8B


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def llama(tmp_path):
    path = tmp_path / "Meta-Llama-3-8B" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(LLAMA3_8B))
    return str(path)


def test_estimate_reads_a_config_json_at_the_sequence_length_given(capsys, llama):
    argv = ["estimate", "tpu-v5p-512", "--strategy", "fsdp", "--model", llama]
    argv += ["--seq-len", "131072", "--global-batch", "256"]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == (
        "estimate   Meta-Llama-3-8B, sequence length 131072, global batch 256 on tpu-v5p-512"
    )
    assert f"note       model Meta-Llama-3-8B read from {llama}" in lines
    assert "note       sequence length 131072 from --seq-len (the model's own: 8192)" in lines
    code, out, _ = run(capsys, *argv, "--format", "json")
    data = json.loads(out)
    model = replace(ModelSpec.from_file(llama), seq_len=131072)
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-v5p-512"))
    want = estimate(plan, model, TrainSpec(global_batch=256))
    assert (data["model"], data["seq_len"]) == ("Meta-Llama-3-8B", 131072)
    assert data["memory_bytes"] == want.memory_bytes and data["flops"] == want.flops
    at_8k = estimate(plan, ModelSpec.from_name("llama3-8b"), TrainSpec(global_batch=256))
    assert want.flops > 16 * at_8k.flops  # 16x the tokens, and attention's quadratic term
    # a catalogue model takes --seq-len too, and says its own length otherwise
    code, out, _ = run(capsys, *argv[:5], "llama3-8b", "--global-batch", "256")
    assert code == 0 and out.startswith("estimate   llama3-8b, sequence length 8192, global")
    assert "read from" not in out and "--seq-len" not in out


def test_models_prints_the_model_a_file_holds(capsys, tmp_path):
    path = tmp_path / "gpt-oss-120b.json"
    path.write_text(json.dumps(GPT_OSS_120B))
    model = ModelSpec.from_file(path)
    code, out, _ = run(capsys, "models", "--model", str(path))
    assert code == 0
    assert f"model      gpt-oss-120b, read from {path}" in out
    assert "params     116.79B (116,789,048,640), active a token 5.71B (5,710,443,840)" in out
    assert "a window of 128 tokens on 18 of 36 layers (every 2nd layer global)" in out
    assert "experts    128 of width 2880, 4 a token (softmax router); 36 of 36 layers MoE" in out
    code, out, _ = run(capsys, "models", "--model", str(path), "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["source"] == str(path) and data["seq_len"] == 131072
    assert (data["num_params"], data["num_active_params"]) == (
        model.num_params,
        model.num_active_params,
    )
    code, out, _ = run(capsys, "models", "--model", "deepseek-v3")
    assert code == 0 and "attention  mla;" in out and "q rank 1536, kv rank 512" in out
    assert "source     configs/models/deepseek-v3.toml: DeepSeek-AI 2024" in out
    code, _, err = run(capsys, "models", "--model", "gpt5")
    assert code == 2 and "model='gpt5' is not a known model nor a model file; accepted:" in err
    code, _, err = run(capsys, "models", "--model", str(tmp_path / "none.json"))
    assert code == 2 and "no readable JSON file" in err


def test_plan_auto_and_the_maxtext_export_read_the_file_and_the_length(capsys, monkeypatch, llama):
    from loadax_mesh.hardware import topology

    monkeypatch.setattr(topology, "topology_devices", simulate_devices)
    argv = ["plan", "tpu-v5p-128", "--strategy", "auto", "--model", llama, "--seq-len", "16384"]
    argv += ["--global-batch", "64", "--remat", "full", "--microbatches", "1"]
    code, out, err = run(capsys, *argv, "--logits-chunks", "1")
    assert code == 0, err
    assert out.startswith("ranking    Meta-Llama-3-8B, global batch 64: ")  # as str(ranking)
    note = next(line for line in out.splitlines() if line.startswith("note       strategy auto"))
    assert " meshes for Meta-Llama-3-8B, sequence length 16384, global batch 64; recipe " in note
    model = replace(ModelSpec.from_file(llama), seq_len=16384)
    recipe = {"remat": "full", "microbatches": 1, "logits_chunks": 1}
    best = choose_mesh("tpu-v5p-128", model, TrainSpec(global_batch=64), recipes=[recipe])
    code, out, _ = run(capsys, *argv, "--logits-chunks", "1", "--format", "json")
    ranking = json.loads(out)["ranking"]
    assert (ranking["model"], ranking["seq_len"]) == ("Meta-Llama-3-8B", 16384)
    assert ranking["choices"][0]["step_seconds"] == best[0].estimate.step_seconds
    export = ["plan", "tpu-v5p-128", "--strategy", "fsdp", "--global-batch", "64"]
    code, out, _ = run(
        capsys, *export, "--model", llama, "--seq-len", "4096", "--format", "maxtext"
    )
    assert code == 0 and "max_target_length=4096" in out and "base_emb_dim=4096" in out
    code, _, err = run(capsys, *export, "--seq-len", "4096", "--format", "maxtext")
    assert code == 2 and "--seq-len N needs --model M" in err
    code, _, err = run(capsys, *export, "--model", llama, "--seq-len", "4096")
    assert code == 2 and "plan reads --model only with --strategy auto" in err
    code, _, err = run(capsys, *export, "--seq-len", "4096")
    assert code == 2 and "plan reads --seq-len only with --strategy auto" in err
    code, _, err = run(capsys, *export, "--model", "gpt-oss-120b", "--format", "maxtext")
    assert code == 2 and "num_experts=128 in a model MaxText does not ship" in err
    code, _, err = run(capsys, *export, "--model", "gemma3-12b", "--format", "maxtext")
    assert code == 2 and "sliding_window=1024 in a model MaxText does not ship has no key" in err


def test_compile_takes_a_model_file_at_the_length_given(capsys, monkeypatch, llama):
    from loadax_mesh.compiler import report
    from loadax_mesh.hardware import topology

    seen = []

    def fake(plan, model, train, *, facts):  # the compile itself: the slow test below
        seen.append(model)
        raise SystemExit(0)

    monkeypatch.setattr(report, "compile_step", fake)
    monkeypatch.setattr(topology, "topology_devices", simulate_devices)
    argv = ["compile", "tpu-v5p-16", "--strategy", "fsdp", "--model", llama, "--seq-len", "512"]
    code, _, _ = run(capsys, *argv, "--global-batch", "8")
    assert code == 0 and seen == [replace(ModelSpec.from_file(llama), seq_len=512)]


@pytest.mark.slow
def test_the_compile_report_names_the_sequence_length_compiled(capsys, tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(
        'name = "tiny-file"\nnum_layers = 2\nd_model = 128\nd_ff = 384\nnum_heads = 8\n'
        "num_kv_heads = 4\nhead_dim = 16\nvocab_size = 512\nseq_len = 128\n"
    )
    argv = ["compile", "--devices", "local", "--strategy", "fsdp", "--model", str(path)]
    code, out, err = run(capsys, *argv, "--seq-len", "256", "--global-batch", "8")
    assert code == 0, err
    assert out.splitlines()[0].startswith("compiled   tiny-file, sequence length 256, global")
    code, out, _ = run(capsys, *argv, "--seq-len", "256", "--global-batch", "8", "--format", "json")
    assert json.loads(out)["seq_len"] == 256
