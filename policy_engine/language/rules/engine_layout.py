"""A rollout role's mesh read as an engine's parallelism: replicas and their ranks.

The role's ``mesh`` (``{dp: 4, tp: 2}``) describes the engine: ``dp`` counts replicas
(each one engine, or one engine for all when the engine runs data parallel itself), the
other dimensions (``pp``, ``tp``, ``ep``) the ranks inside a replica. A policy rank is a
position in that mesh, numbered as every mesh is (outermost first), and rank selectors
choose among them as they choose training ranks. An engine starts and stops all ranks of
a replica at once, so a selector must take whole replicas (:func:`partial_replicas`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from policy_engine.language.values.mesh import coords_from_mesh, mesh_size

#: Mesh dimensions an engine's file names carry.
ENGINE_DIMS = ("dp", "pp", "tp", "ep")


def world_of(mesh: Mapping[str, int] | None) -> int:
    return mesh_size(mesh) if mesh else 1


def replica_of(rank: int, mesh: Mapping[str, int] | None) -> int:
    """The replica (dp coordinate) of policy rank ``rank``."""
    return coords_from_mesh(rank, mesh).get("dp", 0) if mesh else 0


def replicas(mesh: Mapping[str, int] | None) -> int:
    return int(mesh.get("dp", 1)) if mesh else 1


def ranks_of(replica: int, mesh: Mapping[str, int] | None) -> list[int]:
    """The policy ranks of ``replica``, in rank order."""
    return [r for r in range(world_of(mesh)) if replica_of(r, mesh) == replica]


def rank_at(coords: Mapping[str, int], mesh: Mapping[str, int] | None) -> int | None:
    """The policy rank at ``coords`` (dimensions of the mesh that ``coords`` lacks are 0;
    dimensions ``coords`` has beyond the mesh must be 0), or None when outside the mesh."""
    mesh = dict(mesh or {})
    for dim, value in coords.items():
        if dim not in mesh and value != 0:
            return None
    rank = 0
    for dim, size in mesh.items():
        value = coords.get(dim, 0)
        if not 0 <= value < size:
            return None
        rank = rank * size + value
    return rank


def partial_replicas(selected: Iterable[int],
                     mesh: Mapping[str, int] | None) -> list[tuple[int, list[int], list[int]]]:
    """Replicas of which ``selected`` takes some ranks but not all: (replica, taken, left)."""
    chosen = set(selected)
    out = []
    for replica in range(replicas(mesh)):
        ranks = ranks_of(replica, mesh)
        taken = [r for r in ranks if r in chosen]
        if taken and len(taken) != len(ranks):
            out.append((replica, taken, [r for r in ranks if r not in chosen]))
    return out
