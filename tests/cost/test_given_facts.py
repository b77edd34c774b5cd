"""Facts a user gives for one run (`facts=`, `--fact`), and estimates that answer on a condition
where a fact they need has no source (TPU7x's host link). No jax needed."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from loadax_mesh import MeshConfig, MeshConfigError, choose_mesh, simulate_devices
from loadax_mesh.cli.main import main
from loadax_mesh.cost import estimate
from loadax_mesh.cost.estimate import estimate_parts, plan_parts
from loadax_mesh.workload import ModelSpec, TrainSpec
from loadax_mesh.workload.spec import parse_remat

OFFLOAD_70B = parse_remat("layer_input=offload,query=offload,key=offload,value=offload")


def _llama70b_tpu7x(hardware: str = "tpu-7x-128", **options):
    """LLaMA-3 70B over fsdp on TPU7x with the published Ironwood recipes' kind of offload."""
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices(hardware))
    train = TrainSpec(global_batch=2 * plan.shape["fsdp"], remat=OFFLOAD_70B)
    return estimate(plan, ModelSpec.from_name("llama3-70b"), train, **options)


@pytest.mark.parametrize("hardware", ["tpu-7x-128", "tpu-7x-512"])  # 64 and 256 chips
def test_tpu7x_offload_answers_on_the_host_link_condition(hardware):
    e = _llama70b_tpu7x(hardware)
    [condition] = e.assumes
    assert "offload hides behind compute if the host link moves >=" in condition
    assert f"at that bandwidth, {e.step_seconds:.3f} s" in condition
    assert e.offload_exposed_seconds == 0 and e.offload_bytes > 0 and not e.given
    # The threshold is the one the condition names: given exactly that bandwidth (a chip's,
    # as the catalogue counts it), the estimate no longer assumes anything and prices the
    # same step; given half of it, the copies no longer hide and the step grows.
    per_chip = float(condition.split(">= ")[1].split(" GB/s")[0])
    at = _llama70b_tpu7x(hardware, facts={"host_link_bandwidth": f"{per_chip + 0.05} GB/s"})
    assert at.assumes == () and at.given == {"host_link_bandwidth": f"{per_chip + 0.05:g} GB/s"}
    assert at.step_seconds == pytest.approx(e.step_seconds, rel=1e-9)
    half = _llama70b_tpu7x(hardware, facts={"host_link_bandwidth": f"{per_chip / 2} GB/s"})
    assert half.offload_exposed_seconds > 0 and half.step_seconds > e.step_seconds


def test_a_step_without_offload_assumes_nothing_on_tpu7x():
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("tpu-7x-128"))
    e = estimate(plan, ModelSpec.from_name("llama3-8b"), TrainSpec(global_batch=128))
    assert e.assumes == () and e.offload_bytes == 0


def test_copies_that_wait_need_the_fact_itself():
    """On GPU offload copies wait, so no bandwidth makes them free: no condition answers."""
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("gpu-p5.48xlarge-8"))
    r, factors, efficiency, facts = plan_parts(plan)
    train = TrainSpec(global_batch=8, remat="offload")
    model = ModelSpec.from_name("llama3-8b")
    unknown = replace(facts, host_link_bandwidth=None)
    with pytest.raises(MeshConfigError, match=r"no host_link_bandwidth.*--fact host_link"):
        estimate_parts(model, train, r, factors, efficiency, unknown)


def test_a_given_fact_replaces_the_catalogues():
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("gpu-p5.48xlarge-16"))
    model, train = ModelSpec.from_name("llama3-8b"), TrainSpec(global_batch=16)
    shipped = estimate(plan, model, train)
    slow = estimate(plan, model, train, facts={"network_per_gpu": "10 Gbps"})
    assert slow.given == {"network_per_gpu": "10 Gbps"}
    assert slow.step_seconds > shipped.step_seconds  # the gradients' reduction across hosts
    shares = estimate(plan, model, train, facts={"matmul_share": 0.3})
    assert shares.time.matmul > shipped.time.matmul
    assert estimate(plan, model, train).given == {}  # one run's facts stay with that run


@pytest.mark.parametrize(
    ("facts", "message"),
    [
        ({"host_link": "10 GB/s"}, "'host_link' is no fact a tpu estimate reads"),
        ({"host_link_bandwidth": "10"}, r"unit=''; accepted: GB/s, Gbps"),
        ({"host_link_bandwidth": "10 TB/s"}, r"unit='TB/s'; accepted: GB/s, Gbps"),
        ({"host_link_bandwidth": "-3 GB/s"}, "value=-3.0; accepted: a positive number"),
        ({"host_link_bandwidth": "fast"}, "accepted: a number with its unit"),
        ({"matmul_share": 0.5}, "'matmul_share' is no fact a tpu estimate reads"),
        ({"host_link_bandwidth": True}, "accepted: a number with its unit"),
    ],
)
def test_bad_facts_name_the_field_and_what_is_accepted(facts, message):
    with pytest.raises(MeshConfigError, match=message):
        _llama70b_tpu7x(facts=facts)


def test_a_share_out_of_range_is_refused_on_gpu():
    plan = MeshConfig.from_preset("fsdp").plan(simulate_devices("gpu-p5.48xlarge-8"))
    with pytest.raises(MeshConfigError, match=r"facts.matmul_share=1.5.*\(0, 1\]"):
        estimate(plan, ModelSpec.from_name("tiny"), TrainSpec(global_batch=8), facts={
            "matmul_share": 1.5
        })  # fmt: skip


def test_choose_mesh_searches_offload_on_tpu7x_and_ranks_it_after():
    model = ModelSpec.from_name("llama3-70b")
    train = TrainSpec(global_batch=256)
    pinned = choose_mesh("tpu-7x-128", model, train, recipes=[{"remat": "offload"}])
    assert pinned.unsearched == [] and "host link bandwidth" in pinned.assumed[0]
    assert all(c.estimate.assumes and c.unsure for c in pinned)
    ranking = choose_mesh("tpu-7x-128", model, train, top=40)
    unsure = [c.unsure for c in ranking]
    assert any(unsure) and not all(unsure)
    assert unsure == sorted(unsure)  # every choice that assumes nothing comes first
    given = choose_mesh(
        "tpu-7x-128", model, train, recipes=[{"remat": "offload"}], facts={
            "host_link_bandwidth": "100 GB/s"
        }
    )  # fmt: skip
    assert not given.assumed and not any(c.estimate.assumes for c in given)


def test_cli_fact_is_reported_as_given_by_the_user(capsys):
    args = ["estimate", "tpu-7x-128", "--strategy", "fsdp", "--model", "llama3-70b"]
    args += ["--global-batch", "256", "--remat", "offload"]
    assert main(args) == 0
    assumed = capsys.readouterr().out
    assert "assumes    offload hides behind compute if the host link moves >=" in assumed
    assert main([*args, "--fact", "host_link_bandwidth=5GB/s"]) == 0
    given = capsys.readouterr().out
    assert "given      host_link_bandwidth = 5 GB/s (given by the user)" in given
    assert "assumes" not in given
    assert main([*args, "--fact", "host_link_bandwidth=5GB/s", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["given"] == {"host_link_bandwidth": "5 GB/s"} and data["assumes"] == []
    assert main([*args, "--fact", "host_link_bandwidth"]) == 2
    assert "accepted: NAME=VALUE" in capsys.readouterr().err
    plan = ["plan", "tpu-7x-128", "--strategy", "fsdp", "--fact", "peak_bf16=1000TFLOPs"]
    assert main(plan) == 2
    assert "plan reads --fact only with --strategy auto" in capsys.readouterr().err
