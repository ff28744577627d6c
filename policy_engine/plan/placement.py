"""Every rank of a simulated world placed in a role's mesh, and whether the role profiles
there: the one placement loop of ``explain`` and ``nsys-args``, deciding as the run does.

A live process is placed once (:func:`policy_engine.plan.compile.resolve_topology`); a
simulated world of 65,536 ranks is placed here without a :class:`Topology` per rank: the
coordinates follow the mesh in rank order, and only the ranks the role selects get one.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterator
from types import MappingProxyType
from typing import NamedTuple

from policy_engine.language.model import Policy
from policy_engine.language.values.mesh import DIMS
from policy_engine.plan.topology import Topology


class Place(NamedTuple):
    """One rank of a simulated world."""

    rank: int
    local_rank: int
    node: int
    #: its coordinates, in :data:`~policy_engine.language.values.mesh.DIMS` order
    coords: dict[str, int]
    #: where the role profiles, the rank's topology (as :meth:`Topology.for_rank` gives
    #: it); None where it does not
    topology: Topology | None


def places(policy: Policy, role: str, world: int,
           local_world: int | None = None) -> Iterator[Place]:
    """Ranks ``0..world-1`` in the mesh of ``role`` (:meth:`Policy.mesh_for`), each with its
    topology where the role profiles (what :func:`~policy_engine.plan.compile.selects`
    says of it). Raises ValueError when that mesh does not cover ``world``."""
    spec = policy.role(role)
    own = policy.mesh_for(role)
    mesh = MappingProxyType(dict(own)) if own else None
    first = Topology.for_rank(0, world, mesh, local_world)  # checks the mesh, once
    match = spec.ranks.matcher(world, first.selector_sizes()) if spec.enabled else None
    dims = tuple(mesh or ())
    shown = tuple(dim for dim in DIMS if dim in dims)  # the order plans show coordinates in
    pick = _picker([dims.index(dim) for dim in shown])
    indices = itertools.product(*(range(size) for size in mesh.values())) if mesh else \
        itertools.repeat(())
    for rank, index in zip(range(world), indices, strict=False):
        local_rank, node = (rank % local_world, rank // local_world) if local_world else \
            (rank, 0)
        topo = None
        if match is not None:
            asked = dict(zip(dims, index, strict=True))
            asked["local_rank"] = local_rank
            asked["node"] = node
            if match(rank, asked):
                topo = Topology(rank, world, local_rank, node, dict(zip(dims, index, strict=True)),
                                mesh or {}, local_world, "simulated")
        yield Place(rank, local_rank, node, dict(zip(shown, pick(index), strict=True)), topo)


def _picker(order: list[int]) -> Callable[[tuple[int, ...]], tuple[int, ...]]:
    """What takes the items at ``order`` of a tuple, as a tuple."""
    if len(order) > 1:
        return operator.itemgetter(*order)
    return (lambda index: (index[order[0]],)) if order else (lambda index: ())
