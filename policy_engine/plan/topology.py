"""Where a process sits in a distributed job: rank, world, node and mesh coordinates."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs

from policy_engine.language.values.mesh import coords_from_mesh, format_mesh, mesh_size
from policy_engine.plan import discover as _discover

log = logging.getLogger("policy_engine")

def _frozen_map(value: Mapping[str, int] | None) -> Mapping[str, int]:
    if isinstance(value, MappingProxyType):
        return value  # already read-only (explain shares one mesh over every rank)
    return MappingProxyType(dict(value or {}))


@attrs.frozen
class Topology:
    """One process's place in the job.

    ``coords`` holds the parallel coordinates that are known (tp, pp, dp, cp, ep) and
    ``sizes`` the size of each known dimension. ``rank`` and ``world`` are always known:
    0 and 1 outside a distributed job.
    """

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    node: int = 0
    coords: Mapping[str, int] = attrs.field(factory=dict, converter=_frozen_map)
    sizes: Mapping[str, int] = attrs.field(factory=dict, converter=_frozen_map)
    local_world: int | None = None
    source: str = "explicit"

    def __attrs_post_init__(self) -> None:
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is not in a world of {self.world}")

    def __hash__(self) -> int:
        return hash(
            (
                self.rank,
                self.world,
                self.local_rank,
                self.node,
                tuple(sorted(self.coords.items())),
                tuple(sorted(self.sizes.items())),
            )
        )

    def with_mesh(self, mesh: Mapping[str, int]) -> Topology:
        """Fill coordinates that no live source gave from the policy's ``mesh``.

        Raises ValueError when the mesh does not cover the world size.
        """
        if not mesh:
            return self
        _check_mesh(mesh, self.world)
        for dim, size in mesh.items():
            if dim in self.sizes and self.sizes[dim] != size:
                # A live source (DeviceMesh, Megatron) knows better than the file.
                log.debug(
                    "topology: policy mesh says %s=%d but %s says %d; using %s",
                    dim,
                    size,
                    self.source,
                    self.sizes[dim],
                    self.source,
                )
        coords = coords_from_mesh(self.rank, mesh)
        coords.update(self.coords)
        sizes = dict(mesh)
        sizes.update(self.sizes)
        return attrs.evolve(self, coords=coords, sizes=sizes)

    @classmethod
    def discover(cls, mesh: Mapping[str, int] | None = None) -> Topology:
        """This process's topology, from what is live in it.

        Sources, highest first: Megatron ``parallel_state`` (coordinates), then
        ``torch.distributed`` (rank, world), then the launcher's environment (torchrun,
        Slurm, Open MPI), then a single process. Only modules already imported are asked;
        no process group is created and no collective is called. Coordinates no live
        source gives come from ``mesh`` (the policy's), whose size must equal the world.

        Raises ValueError for a malformed launcher variable (naming it) or a mesh that
        does not match the world size.
        """
        topo = cls(**_discover.live_place())
        return topo.with_mesh(mesh) if mesh else topo

    @classmethod
    def from_device_mesh(cls, mesh: Any) -> Topology:
        """This process's topology with coordinates read from a torch ``DeviceMesh``.

        Dimensions are matched by ``mesh_dim_names``: ``tp pp dp cp ep`` as they are,
        ``sp`` -> cp, ``infer_tp`` -> tp, and ``dp_replicate``/``ddp`` with
        ``dp_shard``/``fsdp`` combined into dp (replicate-major). Other names are ignored.
        Rank, world, local rank and node come from :meth:`discover`.
        """
        base = cls.discover()
        found = _discover.device_mesh_coords(mesh, base.rank)
        if found is None:
            return base
        coords, sizes = found
        for dim, index in coords.items():
            if dim in base.coords and base.coords[dim] != index:
                log.debug("topology: %s says %s=%d but the device mesh says %d; using the "
                          "device mesh", base.source, dim, base.coords[dim], index)
        return attrs.evolve(base, coords={**base.coords, **coords},
                            sizes={**base.sizes, **sizes}, source="device_mesh")

    @classmethod
    def for_rank(
        cls,
        rank: int,
        world: int,
        mesh: Mapping[str, int] | None = None,
        local_world: int | None = None,
    ) -> Topology:
        """A simulated process: what ``explain`` uses to predict every rank."""
        local_rank, node = (rank % local_world, rank // local_world) if local_world else (rank, 0)
        if not mesh:
            return cls(rank, world, local_rank, node, local_world=local_world,
                       source="simulated")
        _check_mesh(mesh, world)
        # with_mesh's result, built once: explain places every rank of large worlds.
        sizes = mesh if isinstance(mesh, MappingProxyType) else MappingProxyType(dict(mesh))
        return cls(rank, world, local_rank, node, coords_from_mesh(rank, mesh), sizes,
                   local_world, "simulated")

    def selector_coords(self) -> dict[str, int]:
        """Coordinates a rank selector may test, local_rank and node included."""
        out = dict(self.coords)
        out["local_rank"] = self.local_rank
        out["node"] = self.node
        return out

    def selector_sizes(self) -> Mapping[str, int]:
        """Sizes of the dimensions a rank selector may test, local_rank and node included
        when the number of processes per node is known."""
        if not self.local_world:
            return self.sizes
        out = dict(self.sizes)
        out["local_rank"] = self.local_world
        out["node"] = self.world // self.local_world
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "world": self.world,
            "local_rank": self.local_rank,
            "node": self.node,
            "coords": dict(self.coords),
            "sizes": dict(self.sizes),
            "source": self.source,
        }


def _check_mesh(mesh: Mapping[str, int], world: int) -> None:
    total = mesh_size(mesh)
    if total != world:
        raise ValueError(f"mesh {format_mesh(mesh)} has {total} ranks but the world has {world}")
