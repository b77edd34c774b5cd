"""The hardware catalogue: configs/hardware.toml parsed and checked into frozen dataclasses.

Every fact carries its source keys (the `[sources]` table) and a status (confirmed, secondary,
derived, unconfirmed, unknown). Read once per process with the standard library's tomllib.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from .._configs import config_path
from ..errors import MeshConfigError
from .schema import ENTRY_KEYS, FACT_KEYS, check_entry, check_value
from .user import SHIPPED, merge, origin_file, read_toml, user_path

_STATUSES = ("confirmed", "secondary", "derived", "unconfirmed", "unknown")
_WRAP_RULES = ("full_cube", "dims_of_16", "none")
_UNITS = {
    "GB": 1e9,
    "GiB": 2.0**30,
    "GB/s": 1e9,
    "Gbps": 1e9 / 8,
    "TFLOPs": 1e12,
    "us": 1e-6,
    "GPUs": 1.0,
}


@dataclass(frozen=True)
class Fact:
    """One catalogue fact with its source keys (see `[sources]` in configs/hardware.toml)."""

    value: Any  # None when status is "unknown"
    source: tuple[str, ...]
    unit: str = ""
    status: str = "confirmed"
    note: str = ""

    def __str__(self) -> str:
        if self.value is None:
            return "?"
        shown = "x".join(map(str, self.value)) if isinstance(self.value, tuple) else self.value
        text = f"{shown} {self.unit}".strip()
        return text if self.status in ("confirmed", "secondary") else f"{text} ({self.status})"

    @property
    def base(self) -> float | None:
        """The value in base units: bytes, bytes/s, FLOP/s, seconds (None when unknown)."""
        if self.value is None:
            return None
        if self.unit not in _UNITS:
            raise MeshConfigError(f"hardware.toml: unit {self.unit!r} is not one of {list(_UNITS)}")
        return float(self.value) * _UNITS[self.unit]


@dataclass(frozen=True)
class Topology:
    """A supported TPU slice: the count in the hardware string, chips per dim, chips per host."""

    count: int
    shape: tuple[int, ...]  # as the catalogue names it: 2D on v5e/v6e/v2/v3
    host: tuple[int, ...]  # the chip block of one host, same length as `shape`
    fact: Fact

    @property
    def name(self) -> str:
        return "x".join(map(str, self.shape))


@dataclass(frozen=True)
class HardwareType:
    """One catalogue entry: a TPU generation, a GPU instance type, or CPU."""

    key: str  # what the hardware string names: "v5p", "p5.48xlarge", "cpu"
    platform: str  # "tpu", "gpu" or "cpu"
    title: str
    device_kinds: tuple[str, ...]  # the device_kind JAX reports first, then accepted aliases
    count_unit: str  # "tensorcores", "chips", "gpus" or "devices"
    cores_per_chip: int
    devices_per_chip: int
    devices_per_host: int  # TPU: of a multi-host slice; GPU: GPUs per host; CPU: 0 (any)
    nvlink_domain: int  # GPU: GPUs per NVLink domain; else 0
    topologies: tuple[Topology, ...]
    wraparound_rule: str
    multislice: bool | None  # None: not known (allowed)
    facts: tuple[tuple[str, Fact], ...]
    cloud: str = ""
    origin: str = "shipped"  # or the user catalogue's path (added), or "shipped + <path>"

    @property
    def device_kind(self) -> str:
        return self.device_kinds[0]

    @property
    def pattern(self) -> str:
        """How a hardware string for this entry is written."""
        if self.platform == "tpu":
            return f"tpu-{self.key}-<{self.count_unit}>[-<slices>]"
        return "gpu-" + self.key + "-<GPUs>" if self.platform == "gpu" else "cpu-<N> | cpu-<P>x<K>"

    def whole_gpu_hosts(self, n: int) -> bool:
        """Whether n GPUs are whole hosts of this type in whole NVLink domains (a count below
        one domain is whole hosts inside it)."""
        domain = self.nvlink_domain
        return n % self.devices_per_host == 0 and (n <= domain or n % domain == 0)

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(t.count for t in self.topologies)

    @property
    def examples(self) -> tuple[str, ...]:
        if self.platform == "tpu":
            return tuple(f"tpu-{self.key}-{t.count}" for t in self.topologies)
        if self.platform == "gpu":
            return tuple(f"gpu-{self.key}-{n}" for n in gpu_examples(self))
        return ("cpu-8", "cpu-2x4")

    def fact(self, name: str) -> Fact | None:
        return dict(self.facts).get(name)


# -- the catalogue ----------------------------------------------------------------------------


def _fact(data: Any, *, name: str, where: str, sources: dict[str, str]) -> Fact:
    unknown = sorted(set(data) - set(FACT_KEYS)) if isinstance(data, dict) else []
    if unknown:
        raise MeshConfigError(
            f"{where}: unknown key {unknown[0]!r}; accepted in a fact: {', '.join(FACT_KEYS)}"
        )
    if not isinstance(data, dict) or "source" not in data:
        raise MeshConfigError(
            f"{where}={data!r}; accepted: a fact table {{ value = ..., source = [keys] }}"
        )
    status, src = data.get("status", "confirmed"), data["source"]
    if status not in _STATUSES:
        raise MeshConfigError(f"{where}: status={status!r}; accepted: {', '.join(_STATUSES)}")
    if not isinstance(src, list) or not src or not all(isinstance(s, str) for s in src):
        raise MeshConfigError(f"{where}: source={src!r}; accepted: a list of keys of [sources]")
    missing = [s for s in src if s not in sources]
    if missing:
        raise MeshConfigError(
            f"{where}: source keys {missing} are not in [sources]; accepted: keys of [sources] "
            "(the shipped catalogue's or the file's own)"
        )
    value, unit, note = data.get("value"), data.get("unit", ""), data.get("note", "")
    if (value is None) != (status == "unknown"):
        raise MeshConfigError(
            f"{where}: value={value!r} with status={status!r}; accepted: a value unless "
            "status = 'unknown', and none with it"
        )
    if not isinstance(unit, str) or not isinstance(note, str):
        raise MeshConfigError(f"{where}: unit={unit!r}, note={note!r}; accepted: strings")
    check_value(name, value, unit, where=where)
    value = tuple(value) if isinstance(value, list) else value
    return Fact(value, tuple(src), unit, status, note)


def _facts(
    entry: dict[str, Any], *, platform: str, where: str, sources: dict[str, str]
) -> dict[str, Fact]:
    check_entry(entry, platform=platform, where=where)
    return {
        k: _fact(v, name=k, where=f"{where}.{k}", sources=sources)
        for k, v in entry.items()
        if k not in ENTRY_KEYS[platform]
    }


def _dims(text: Any, *, where: str) -> tuple[int, ...]:
    if not isinstance(text, str) or not re.fullmatch(r"[1-9]\d*(x[1-9]\d*)*", text):
        raise MeshConfigError(f"{where}: shape={text!r}; accepted: a shape such as 4x8x8")
    return tuple(int(d) for d in text.split("x"))


def _tpu_type(
    key: str, entry: dict[str, Any], sources: dict[str, str], *, where: str
) -> HardwareType:
    facts = _facts(entry, platform="tpu", where=where, sources=sources)
    get = {k: f.value for k, f in facts.items()}
    host = tuple(get["host_block"])
    topologies = []
    items = entry.get("topologies")
    if not isinstance(items, list) or not items:
        raise MeshConfigError(
            f"{where}.topologies={items!r}; accepted: a list of {{ shape = ..., source = [...] }}"
        )
    for i, item in enumerate(items):
        at = f"{where}.topologies[{i}]"
        if not isinstance(item, dict):
            raise MeshConfigError(f"{at}={item!r}; accepted: {{ shape = ..., source = [...] }}")
        shape = _dims(item.get("shape"), where=at)
        fields = {k: v for k, v in item.items() if k not in ("shape", "host")}
        fact = _fact({**fields, "value": item["shape"]}, name="topology", where=at, sources=sources)
        block = tuple(item.get("host", [min(h, s) for h, s in zip(host, shape, strict=False)]))
        if (
            len(shape) != get["dims"]
            or len(block) != len(shape)
            or any(
                not isinstance(b, int) or b < 1 or s % b for s, b in zip(shape, block, strict=True)
            )
        ):
            raise MeshConfigError(
                f"{at}: shape {shape} with host block {block}; accepted: {get['dims']} dims, "
                "each a whole number of the host block's"
            )
        chips = math.prod(shape)
        count = chips * (get["cores_per_chip"] if get["count_unit"] == "tensorcores" else 1)
        topologies.append(Topology(count, shape, block, fact))
    topologies.sort(key=lambda t: t.count)
    if len({t.count for t in topologies}) != len(topologies):
        raise MeshConfigError(f"{where}.topologies: two topologies share a count")
    if get["wraparound"] not in _WRAP_RULES:
        raise MeshConfigError(
            f"{where}.wraparound: value={get['wraparound']!r}; accepted: {', '.join(_WRAP_RULES)}"
        )
    return HardwareType(
        key=key,
        platform="tpu",
        title=entry["title"],
        device_kinds=(get["device_kind"], *get.get("device_kind_aliases", ())),
        count_unit=get["count_unit"],
        cores_per_chip=get["cores_per_chip"],
        devices_per_chip=get["devices_per_chip"],
        devices_per_host=get["chips_per_host"] * get["devices_per_chip"],
        nvlink_domain=0,
        topologies=tuple(topologies),
        wraparound_rule=get["wraparound"],
        multislice=get.get("multislice"),
        facts=tuple(facts.items()),
    )


def _gpu_type(
    key: str, entry: dict[str, Any], sources: dict[str, str], *, where: str
) -> HardwareType:
    facts = _facts(entry, platform="gpu", where=where, sources=sources)
    per_host, domain = facts["gpus_per_host"].value, facts["nvlink_domain"].value
    if not isinstance(domain, int) or domain % per_host:
        raise MeshConfigError(
            f"{where}.nvlink_domain: value={domain!r}; accepted: a whole number of hosts of "
            f"gpus_per_host={per_host} GPUs"
        )
    return HardwareType(
        key=key,
        platform="gpu",
        title=entry["title"],
        device_kinds=(facts["device_kind"].value,),
        count_unit="gpus",
        cores_per_chip=1,
        devices_per_chip=1,
        devices_per_host=per_host,
        nvlink_domain=domain,
        topologies=(),
        wraparound_rule="none",
        multislice=True,
        facts=tuple(facts.items()),
        cloud=entry.get("cloud", ""),
    )


@dataclass(frozen=True)
class Catalogue:
    """All entries in file order, and the source keys with what they stand for."""

    types: tuple[HardwareType, ...]
    sources: tuple[tuple[str, str], ...]
    gpu_client: tuple[tuple[str, Fact], ...] = ()  # jax's GPU client: what a process may use
    user_file: str | None = None  # the user catalogue merged in (user.py), if any

    def get(self, platform: str, key: str) -> HardwareType | None:
        return next((t for t in self.types if t.platform == platform and t.key == key), None)

    def keys(self, platform: str) -> list[str]:
        return [t.key for t in self.types if t.platform == platform]


def catalogue() -> Catalogue:
    """The catalogue this run reads: configs/hardware.toml, merged with the user's catalogue
    where one is loaded (`load_catalogue`, `--catalogue`, $LOADAX_MESH_CATALOGUE; user.py)."""
    return _read(user_path())


_generation = 0  # how often the catalogues were forgotten


def clear_catalogue() -> None:
    """Forget the catalogues read so far (the next `catalogue()` reads its files again)."""
    global _generation
    _generation += 1
    _read.cache_clear()


def catalogue_key() -> tuple[str | None, int]:
    """What names the catalogue `catalogue()` gives now: for caches of what is read from it."""
    return user_path(), _generation


@lru_cache(maxsize=4)
def _read(user_file: str | None) -> Catalogue:
    shipped_file = "configs/hardware.toml"
    data = read_toml(str(config_path("hardware.toml")))
    origins: dict[tuple[str, str], str] = {}
    if user_file is not None:
        data, origins = merge(data, read_toml(user_file), user_file)
    sources = data["sources"]
    types = []
    for platform, parse in (("tpu", _tpu_type), ("gpu", _gpu_type)):
        for key, entry in data[platform].items():
            origin = origins.get((platform, key), SHIPPED)
            name = f'"{key}"' if "." in key else key
            where = f"{origin_file(origin, shipped_file)}: {platform}.{name}"
            if not isinstance(entry, dict):
                raise MeshConfigError(f"{where}={entry!r}; accepted: a table of facts")
            types.append(replace(parse(key, entry, sources, where=where), origin=origin))
    cpu = _facts(data["cpu"], platform="cpu", where=f"{shipped_file}: cpu", sources=sources)
    types.append(
        HardwareType(
            key="cpu",
            platform="cpu",
            title=data["cpu"]["title"],
            device_kinds=(cpu["device_kind"].value,),
            count_unit="devices",
            cores_per_chip=1,
            devices_per_chip=1,
            devices_per_host=0,
            nvlink_domain=0,
            topologies=(),
            wraparound_rule="none",
            multislice=None,
            facts=tuple(cpu.items()),
        )
    )
    client = _facts(
        data["gpu_client"],
        platform="gpu_client",
        where=f"{shipped_file}: gpu_client",
        sources=sources,
    )
    return Catalogue(tuple(types), tuple(sources.items()), tuple(client.items()), user_file)


def list_hardware() -> list[HardwareType]:
    """Every catalogue entry, TPU generations first, then GPU instance types, then CPU."""
    return list(catalogue().types)


def gpu_examples(t: HardwareType) -> list[int]:
    """A few valid GPU counts: one host, one NVLink domain and more."""
    domain = t.nvlink_domain
    if domain > t.devices_per_host:
        return [t.devices_per_host, domain, 2 * domain]
    return [domain, 8 * domain, 32 * domain]


def types_of_kind(platform: str, device_kind: str) -> list[HardwareType]:
    """The entries of a platform whose device_kind (or an alias) is `device_kind`: a user
    catalogue's first (detection names the user's own machine), then in file order."""
    found = [
        t for t in catalogue().types if t.platform == platform and device_kind in t.device_kinds
    ]
    return sorted(found, key=lambda t: t.origin == SHIPPED)


def tpu_type_of_kind(device_kind: str) -> HardwareType | None:
    """The TPU generation whose device_kind (or an alias) JAX reports as `device_kind`."""
    return next(iter(types_of_kind("tpu", device_kind)), None)


def host_memory_per_device(t: HardwareType) -> float | None:
    """Host memory (bytes) one JAX device may count on for buffers offloaded to the host: the
    catalogue's `host_memory` of one host (TPU: the VM of a multi-host slice) over the devices
    that host serves. None where the catalogue does not know it (status "unknown") or the
    entry has no fixed host (CPU)."""
    fact = t.fact("host_memory")
    if fact is None or fact.base is None or t.devices_per_host <= 0:
        return None
    return fact.base / t.devices_per_host
