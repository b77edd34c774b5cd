"""The published training runs the benchmarks price, as data: configs/runs/<name>.toml.

`production` is the dense calibration set (docs/facts/production_runs.md; configs/calibration.toml
was fitted on it); `moe`, `pipeline` and `long_context` the measured mixture-of-experts,
pipeline-parallel and long-context (no pipeline) runs (docs/facts/moe_runs.md). Each file's head
says what its fields mean and where each fact comes from. A file's `[[group]]` tables hold the
fields their runs share and the runs' own (`[[group.run]]`); a table field such as `train`
merges key by key with the group's. A `source`, `notes` or `missing` string, or an
`assumptions` entry, that is a key of the file's `[text]` table stands for that text. A fact
the source does not state is absent. Pure Python (tomllib): the benchmarks and the tests read
the runs here, not through sys.path.
"""

from __future__ import annotations

import copy
import tomllib
from functools import cache
from typing import Any

from ._configs import config_path
from .errors import MeshConfigError

SETS = ("production", "moe", "pipeline", "long_context")
_CITED = ("source", "notes", "missing")


def published_runs(name: str) -> dict[str, Any]:
    """configs/runs/<name>.toml with its groups expanded into `runs` (a list of dicts, in the
    file's order); every other top-level key as the file has it. A fresh copy each call."""
    if name not in SETS:
        raise MeshConfigError(f"published_runs: name={name!r} is no set of runs; accepted: {SETS}")
    return copy.deepcopy(_expanded(name))


@cache
def _expanded(name: str) -> dict[str, Any]:
    with config_path("runs", f"{name}.toml").open("rb") as f:
        data = tomllib.load(f)
    texts: dict[str, str] = data.get("text", {})
    runs = []
    for group in data.pop("group"):
        shared = {k: v for k, v in group.items() if k != "run"}
        for own in group["run"]:
            run = dict(shared)
            for k, v in own.items():
                merge = isinstance(v, dict) and isinstance(run.get(k), dict)
                run[k] = run[k] | v if merge else v
            runs.append(_cite(run, texts))
    return {"runs": runs, **data}


def _cite(run: dict[str, Any], texts: dict[str, str]) -> dict[str, Any]:
    """The run with each named text written out."""
    for k in _CITED:
        if k in run:
            run[k] = texts.get(run[k], run[k])
    if "assumptions" in run:
        run["assumptions"] = [texts.get(a, a) for a in run["assumptions"]]
    return run
