"""The chooser's floors (cost/choose/search.py's `compute_floor`, and a split's, which adds what
the recipe spends across granules): lower bounds on every recipe's priced step, so that
`fastest`, which skips a recipe whose floor is slower than the best priced, returns what pricing
every recipe would, and a mesh's floors ones on its bound (the planner prices each only when the
one below comes first). Pure, no compile."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadax_mesh.cost.calibration import Calibrated
from loadax_mesh.cost.choose.mesh import Ranking, _candidates
from loadax_mesh.cost.choose.mesh import _search_options as options
from loadax_mesh.cost.choose.pipeline import dcn_pipelines
from loadax_mesh.cost.choose.search import Search, compute_floor, fastest, key
from loadax_mesh.cost.choose.space import BATCH, Space
from loadax_mesh.cost.estimate import across_granules, price
from loadax_mesh.hardware.profile import hardware_profile
from loadax_mesh.workload import ModelSpec, TrainSpec

BOTH = [{"moe": "dropless"}, {"moe": "capacity"}]
# (hardware, model, seq_len (0: the model's), batch, recipes, what the search must hold)
CASES = [
    ("tpu-v5p-128", "llama3-8b", 0, 64, None, "plain"),  # offloading recipes
    ("gpu-p5.48xlarge-16", "llama3-8b", 0, 64, None, "pipeline"),  # pipelines across hosts
    pytest.param(  # both MoE paths (3 s)
        ("gpu-p5e.48xlarge-16", "mixtral-8x7b", 0, 64, BOTH, "pipeline"), marks=pytest.mark.slow
    ),
    ("tpu-v5p-64", "llama3-8b", 65536, 8, None, "seq"),  # both context strategies
]


def _candidates_of(hardware, name, seq_len, batch, recipes, _):
    model = ModelSpec.from_name(name)
    model = replace(model, seq_len=seq_len) if seq_len else model
    train = TrainSpec(global_batch=batch)
    names, wanted = options(model, train, None, 5, 0.1, recipes)
    spec, device = hardware_profile(hardware).spec, hardware_profile(hardware).facts()
    spaces = [Space(names, tuple(a for a in names if a in BATCH))]
    spaces += dcn_pipelines(spaces[0], spec.granules, model, train)
    link = float(max(1, sum(d > 1 for d in spec.topology)))
    search = Search(model, train, wanted, device, 0.1, spec.granules, link)
    found = _candidates(search, spaces, spec.num_devices, hardware, Ranking())
    return model, device, link, found


@pytest.mark.parametrize("case", CASES, ids=["v5p-8b", "p5-8b", "p5e-mixtral", "v5p-8b-64k"])
def test_floor_bounds_every_recipe_and_fastest_is_exhaustive(case) -> None:
    model, device, link, found = _candidates_of(*case)
    calibrated = Calibrated.of(device.platform)
    assert found
    held = {"plain": 0, "pipeline": 0, "seq": 0}
    tighter = 0  # recipes whose split floor is above their compute floor
    for c in found:
        links = dict.fromkeys(c.space.names, link)
        held["plain"] += not c.staged
        held["pipeline"] += c.staged
        held["seq"] += c.roles.size("seq") > 1
        dcn = across_granules(device, c.factors, calibrated.dcn_latency, calibrated.slice_bandwidth)
        keys = []
        for k, recipe in enumerate(c.recipes):
            floor = compute_floor(model, recipe, c.roles, device, calibrated)
            p = price(model, recipe.train, c.roles, c.factors, links, device, calibrated,
                      terms=recipe.terms, dcn=dcn)  # fmt: skip
            # the split's floor adds what the recipe spends across granules: still below
            assert 0 < floor <= c.split_floors[k] <= p.time.seconds
            tighter += c.split_floors[k] > floor
            keys.append((recipe.beyond or bool(p.assumes), *key(p, recipe.peak), k))
        # pricing every recipe: a sure one ranks before every unsure one, so the least key
        best = fastest(model, c.roles, c.factors, links, device, c.recipes)
        assert best.key[:-1] == min(keys) and c.bound == best.key
        # the planner waits on each before pricing the next
        assert c.floor <= c.split_floor <= c.bound
    assert held[case[-1]]  # each case searches what it names
    assert bool(tighter) == (case[0].startswith("gpu"))  # only the GPU cases span granules
