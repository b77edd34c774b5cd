"""The cost of one training step, as one interface with two implementations: the plain step
and the pipelined one built from it. `step_cost` decides which, once, from the recipe and the
roles; the estimate and the chooser read only the interface (memory terms, FLOPs, collectives,
the mesh axes' traffic, the step's seconds), never "is there a pipeline?" again."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..hardware.profile import DeviceFacts
from ..workload.layout import Roles
from ..workload.spec import ModelSpec, TrainSpec
from ..workload.stages import Stages, resolved
from .calibration import Calibrated
from .memory.terms import memory_terms
from .parts.flops import step_flops
from .parts.traffic import Collective, collectives
from .pipeline.memory import pipeline_memory_terms
from .pipeline.stages import pipeline_of
from .pipeline.time import pipeline_flops, pipeline_time
from .pipeline.traffic import pipeline_axis, pipeline_collectives
from .timing.axes import AxisTraffic, axis_traffic
from .timing.step import StepTime, step_time

# The collectives' seconds a step's time adds up: (hidden inside granules, exposed inside
# granules, across granules)
Waits = tuple[float, float, float]


@lru_cache(maxsize=16384)
def step_cost(model: ModelSpec, train: TrainSpec, roles: Roles) -> PlainStep:
    """The step on these roles: pipelined where the mesh has a pipeline axis larger than 1
    (its fields checked, `pipeline_of`), else plain; found once (the chooser's floors and
    prices ask for the same)."""
    st = pipeline_of(model, train, roles)
    if st is None:
        return PlainStep(model, train, roles)
    return PipelinedStep(model, resolved(train, st), roles, st)


@dataclass(frozen=True)
class PlainStep:
    """What a step costs on one device, part by part (the interface both steps answer): every
    layer on every device, as memory/terms.py, parts/flops.py, parts/traffic.py and
    timing/step.py price it. `train` is the recipe as the step runs it (`stages.resolved`),
    `pipeline` its stages (None: none)."""

    model: ModelSpec
    train: TrainSpec
    roles: Roles

    @property
    def pipeline(self) -> Stages | None:
        return None

    def memory_terms(
        self, device: DeviceFacts, *, replicas_across_granules: bool = False
    ) -> dict[str, int]:
        held = replicas_across_granules
        return memory_terms(
            self.model, self.train, self.roles, device, replicas_across_granules=held
        )

    def flops(self, *, grouped: str) -> tuple[float, float, float]:
        return step_flops(self.model, self.train, self.roles, grouped=grouped)

    def collectives(self, *, overlapped: bool, regather: bool) -> list[Collective]:
        """Found once a step and flags: the chooser's floor and its price ask for the same."""
        return list(_found(self, overlapped, regather))

    def _collectives(self, overlapped: bool, regather: bool) -> list[Collective]:
        return collectives(
            self.model, self.train, self.roles, overlapped=overlapped, regather=regather
        )

    def axes(
        self,
        found: list[Collective],
        factors: dict[str, tuple[int, int]],
        efficiency: dict[str, float],
        priced: DeviceFacts,
    ) -> dict[str, AxisTraffic]:
        return axis_traffic(found, self.roles, factors, efficiency, priced)

    def time(
        self,
        facts: DeviceFacts,
        waits: Waits,
        calibrated: Calibrated,
        *,
        offload_bytes: float,
        kept_bytes: float,
    ) -> StepTime:
        hidden, exposed, across = waits
        return step_time(
            self.model,
            self.train,
            self.roles,
            facts,
            efficiency=calibrated.compute_efficiency,
            intensity=calibrated.intensity,
            hidden=hidden,
            exposed=exposed,
            across_granules=across,
            offload_bytes=offload_bytes,
            kept_bytes=kept_bytes,
            permute_share=calibrated.permute_share,
        )


@dataclass(frozen=True)
class PipelinedStep(PlainStep):
    """The last layers as stages over the pipeline axis (`stages`), the rest of the step with
    that axis acting as data: cost/pipeline/ builds each part from the plain step's."""

    stages: Stages

    @property
    def pipeline(self) -> Stages | None:
        return self.stages

    def memory_terms(
        self, device: DeviceFacts, *, replicas_across_granules: bool = False
    ) -> dict[str, int]:
        held = replicas_across_granules
        return pipeline_memory_terms(
            self.model, self.train, self.roles, self.stages, device, replicas_across_granules=held
        )

    def flops(self, *, grouped: str) -> tuple[float, float, float]:
        return pipeline_flops(self.model, self.train, self.roles, self.stages, grouped=grouped)

    def _collectives(self, overlapped: bool, regather: bool) -> list[Collective]:
        return pipeline_collectives(
            self.model, self.train, self.roles, self.stages, overlapped=overlapped,
            regather=regather,
        )  # fmt: skip

    def axes(
        self,
        found: list[Collective],
        factors: dict[str, tuple[int, int]],
        efficiency: dict[str, float],
        priced: DeviceFacts,
    ) -> dict[str, AxisTraffic]:
        out = super().axes(found, factors, efficiency, priced)
        axis = self.stages.axis
        (ici, dcn), link = factors[axis], efficiency.get(axis, 1.0)
        out[axis] = pipeline_axis(found, axis, ici, dcn, link, priced)
        return out

    def time(
        self,
        facts: DeviceFacts,
        waits: Waits,
        calibrated: Calibrated,
        *,
        offload_bytes: float,
        kept_bytes: float,
    ) -> StepTime:
        """The pipelined step offloads nothing (`pipeline_of` refuses it) and prices what its
        stages keep itself."""
        c = calibrated
        return pipeline_time(
            self.model, self.train, self.roles, self.stages, facts, waits,
            c.compute_efficiency, c.intensity, c.permute_share,
        )  # fmt: skip


@lru_cache(maxsize=8192)
def _found(step: PlainStep, overlapped: bool, regather: bool) -> tuple[Collective, ...]:
    return tuple(step._collectives(overlapped, regather))
