"""What the ranking's text reads of `choose_mesh`'s `Ranking` and `Choice`.

`str(ranking)` calls view/estimate.py's `ranking_text`, so the view names the attributes it
reads here instead of importing the cost model's classes (which would close a circle), as
picture.py's `PlanView` does for `MeshPlan`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..cost.estimate import Estimate
    from ..hardware.profile import DeviceFacts
    from ..workload.spec import TrainSpec
    from .picture import PlanView


class ChoiceView(Protocol):
    """One ranked mesh (`Choice`): its plan, estimate and recipe."""

    @property
    def plan(self) -> PlanView: ...
    @property
    def estimate(self) -> Estimate: ...
    @property
    def train(self) -> TrainSpec: ...
    @property
    def beyond_headroom(self) -> bool: ...
    @property
    def ici(self) -> tuple[int, ...]: ...
    @property
    def dcn(self) -> tuple[int, ...]: ...


class RankingView(Protocol):
    """The choices best first (`Ranking`), and how the search went."""

    @property
    def considered(self) -> int: ...
    @property
    def pruned(self) -> dict[str, int]: ...
    @property
    def planned(self) -> int: ...
    @property
    def unsearched(self) -> list[str]: ...
    @property
    def assumed(self) -> list[str]: ...
    @property
    def stages(self) -> tuple[int, ...]: ...
    @property
    def with_pipeline(self) -> ChoiceView | None: ...
    @property
    def without_pipeline(self) -> ChoiceView | None: ...
    @property
    def device(self) -> DeviceFacts | None: ...
    def __iter__(self) -> Iterator[ChoiceView]: ...
    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> ChoiceView: ...
