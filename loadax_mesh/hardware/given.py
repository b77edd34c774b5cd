"""Facts a user gives for one run (`--fact NAME=VALUE`, `facts={...}`): a catalogue fact of
the hardware's type set to a value with its unit, checked as strictly as a catalogue file and
reported as "given by the user" wherever an estimate prints its facts."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import MeshConfigError
from .schema import check_value

GIVEN = "given by the user"
# The facts a run may set: the ones a device's facts are read from (profile._device_facts),
# per platform; the rest of an entry (topology, counts) is the catalogue's to say.
SETTABLE = {
    "tpu": (
        *("peak_bf16", "hbm_bandwidth", "host_link_bandwidth", "ici_link_bandwidth"),
        *("ici_latency", "dcn_bandwidth", "dcn_latency"),
        *("peak_fp8", "peak_int8", "fp8_matmul_share", "int8_matmul_share"),
    ),
    "gpu": (
        *("peak_bf16", "hbm_bandwidth", "host_link_bandwidth", "nvlink_bandwidth"),
        *("nvlink_latency", "network_per_gpu", "network_latency"),
        *("matmul_share", "attention_share", "memory_share", "grouped_matmul_share"),
        *("peak_fp8", "peak_int8", "fp8_matmul_share", "int8_matmul_share"),
    ),
}
_VALUE = re.compile(r"\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z/]*)\s*")


@dataclass(frozen=True)
class GivenFact:
    """One fact the user gave: its catalogue name, value and unit (as the catalogue writes it)."""

    name: str
    value: float
    unit: str

    @property
    def text(self) -> str:
        return f"{self.value:g} {self.unit}".strip()


Given = tuple[GivenFact, ...]


def given_facts(facts: Mapping[str, str | float] | None, *, platform: str, hardware: str) -> Given:
    """`facts` checked: each name a fact this platform's devices are read from, each value a
    positive number with one of its accepted units ("40 GB/s", "40GB/s"; a share: a number in
    (0, 1]). Sorted by name, so equal facts give equal profiles."""
    if facts is None:
        return ()
    if not isinstance(facts, Mapping):
        raise MeshConfigError(
            f"facts={facts!r}; accepted: a mapping of fact name to value, e.g. "
            "{'host_link_bandwidth': '100 GB/s'}"
        )
    settable = SETTABLE.get(platform, ())
    out = []
    for name, raw in sorted(facts.items()):
        if name not in settable:
            raise MeshConfigError(
                f"facts: {name!r} is no fact a {platform} estimate reads for {hardware}; "
                f"accepted: {', '.join(settable) or 'none (no catalogue facts)'}"
            )
        value, unit = _number_and_unit(name, raw)
        check_value(name, value, unit, where=f"facts.{name}={raw!r}")
        out.append(GivenFact(name, value, unit))
    return tuple(out)


def parse_fact_flag(text: str) -> tuple[str, str]:
    """`--fact NAME=VALUE` as (name, value text)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise MeshConfigError(
            f"--fact {text!r}; accepted: NAME=VALUE with its unit, e.g. host_link_bandwidth=100GB/s"
        )
    return name.strip(), value.strip()


def _number_and_unit(name: str, raw: str | float) -> tuple[float, str]:
    if isinstance(raw, bool):
        raise MeshConfigError(f"facts.{name}={raw!r}; accepted: a number with its unit")
    if isinstance(raw, int | float):
        return float(raw), ""
    found = _VALUE.fullmatch(raw) if isinstance(raw, str) else None
    if found is None:
        raise MeshConfigError(
            f"facts.{name}={raw!r}; accepted: a number with its unit, e.g. '100 GB/s'"
        )
    return float(found[1]), found[2]
