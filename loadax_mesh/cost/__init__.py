"""The cost model (docs/design.md section 8): memory, compute and collectives of the reference step
on a plan, and the mesh that makes it fastest. Pure Python: no jax."""

from .choose.mesh import Choice, Ranking, choose_mesh
from .estimate import Estimate, estimate

__all__ = ["Choice", "Estimate", "Ranking", "choose_mesh", "estimate"]
