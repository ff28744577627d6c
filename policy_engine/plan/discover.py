"""Finding a process's topology from what is already live in it.

Sources, highest first: a ``DeviceMesh`` the caller hands over, Megatron's
``parallel_state``, ``torch.distributed``, the launcher's environment (torchrun, Slurm,
Open MPI), and last a single process. Only what is already imported and initialized is
read: discovery never imports torch or Megatron, never initializes a process group and
never calls a collective, so it is safe (and cheap) on every rank at any time.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from policy_engine.language.values.mesh import DIMS

log = logging.getLogger("policy_engine")

#: DeviceMesh dimension names understood besides tp/pp/dp/cp/ep themselves.
#: ``sp`` is Ulysses-style sequence parallelism (verl's ``("dp", "sp")`` mesh): it splits
#: the sequence over its own ranks, which is what ``cp`` means here. ``infer_tp`` is the
#: tensor-parallel dimension of verl's rollout mesh.
MESH_ALIASES: Mapping[str, str] = {
    "sp": "cp",
    "infer_tp": "tp",
}
#: Names of the two halves of data parallelism under HSDP (torchtitan, verl). They combine
#: into ``dp``: size replicate * shard, coordinate replicate_idx * shard_size + shard_idx,
#: the order ``DeviceMesh._flatten`` and torchtitan's flattened ``dp`` use.
DP_REPLICATE_NAMES: tuple[str, ...] = ("dp_replicate", "ddp")
DP_SHARD_NAMES: tuple[str, ...] = ("dp_shard", "fsdp", "fsdp_shard")

_MEGATRON_GETTERS: tuple[tuple[str, str], ...] = (
    ("tp", "tensor_model_parallel"),
    ("pp", "pipeline_model_parallel"),
    ("dp", "data_parallel"),
    ("cp", "context_parallel"),
    ("ep", "expert_model_parallel"),
)


@attrs.frozen
class _Launch:
    """What a launcher's environment says; None where it says nothing."""

    source: str
    rank: int
    world: int
    local_rank: int | None = None
    local_world: int | None = None
    node: int | None = None


def _env_int(env: Mapping[str, str], name: str, minimum: int = 0) -> int | None:
    value = env.get(name)
    if value is None or not value.strip():
        return None
    try:
        number = int(value.strip())
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None
    if number < minimum:
        raise ValueError(f"environment variable {name}={value!r} must be at least {minimum}")
    return number


def _slurm_tasks_per_node(env: Mapping[str, str]) -> int | None:
    # Slurm writes "4" or "4(x2)" when every node runs the same number of tasks and
    # "4(x2),3" otherwise; only a uniform count is a local world size.
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"):
        value = env.get(name, "").strip()
        match = re.fullmatch(r"(\d+)(?:\(x\d+\))?", value)
        if match and int(match.group(1)) > 0:
            return int(match.group(1))
    return None


def _torchrun(env: Mapping[str, str]) -> _Launch | None:
    rank, world = _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE", minimum=1)
    if rank is None and world is None:
        return None
    if rank is None or world is None:
        # torch's env:// rendezvous would fail the same way; say so before training starts.
        missing, present = ("RANK", "WORLD_SIZE") if rank is None else ("WORLD_SIZE", "RANK")
        raise ValueError(f"environment variable {present} is set but {missing} is not")
    return _Launch(
        "torchrun",
        rank,
        world,
        local_rank=_env_int(env, "LOCAL_RANK"),
        local_world=_env_int(env, "LOCAL_WORLD_SIZE", minimum=1),
        node=_env_int(env, "GROUP_RANK"),
    )


def _slurm(env: Mapping[str, str]) -> _Launch | None:
    rank, world = _env_int(env, "SLURM_PROCID"), _env_int(env, "SLURM_NTASKS", minimum=1)
    if rank is None or world is None:
        # Batch scripts and salloc shells carry some SLURM_* variables but are no task.
        return None
    return _Launch("slurm", rank, world, local_rank=_env_int(env, "SLURM_LOCALID"),
                   local_world=_slurm_tasks_per_node(env), node=_env_int(env, "SLURM_NODEID"))


def _openmpi(env: Mapping[str, str]) -> _Launch | None:
    rank = _env_int(env, "OMPI_COMM_WORLD_RANK")
    world = _env_int(env, "OMPI_COMM_WORLD_SIZE", minimum=1)
    if rank is None or world is None:
        return None
    # Open MPI names no node index; rank // local size below assumes its default
    # by-slot mapping (a node's ranks are consecutive).
    local = _env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK")
    return _Launch("openmpi", rank, world, local_rank=local,
                   local_world=_env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", minimum=1))


def launcher_from_env(env: Mapping[str, str]) -> _Launch | None:
    """The first launcher whose variables are set: torchrun, then Slurm, then Open MPI.

    Raises ValueError naming the variable when a value is malformed.
    """
    found: _Launch | None = None
    for reader in (_torchrun, _slurm, _openmpi):
        launch = reader(env)
        if launch is None:
            continue
        if launch.rank >= launch.world:
            raise ValueError(
                f"{launch.source} environment gives rank {launch.rank} "
                f"but a world of {launch.world}"
            )
        if found is None:
            found = launch
        elif (launch.rank, launch.world) != (found.rank, found.world):
            # Normal under `srun torchrun`: Slurm counts launchers, torchrun counts workers.
            log.debug(
                "topology: %s says rank %d of %d, %s says rank %d of %d; using %s",
                found.source,
                found.rank,
                found.world,
                launch.source,
                launch.rank,
                launch.world,
                found.source,
            )
    return found


def _torch_distributed() -> tuple[int, int] | None:
    # Looking must not import torch: a process that never imported it is not distributed
    # through it, and importing it costs seconds.
    dist: Any = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return None
    return int(dist.get_rank()), int(dist.get_world_size())


def _megatron() -> tuple[dict[str, int], dict[str, int]] | None:
    # parallel_state is imported by megatron.core itself; if it is not loaded, nothing
    # initialized it. Importing Megatron here would be slow and has side effects.
    state: Any = sys.modules.get("megatron.core.parallel_state")
    if state is None:
        return None
    try:
        if not state.model_parallel_is_initialized():
            return None
    except Exception as exc:  # any Megatron version quirk must not stop training
        log.debug("topology: megatron parallel_state not usable: %r", exc)
        return None
    coords: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for dim, group in _MEGATRON_GETTERS:
        try:
            size = int(getattr(state, f"get_{group}_world_size")())
            index = int(getattr(state, f"get_{group}_rank")())
        except Exception as exc:  # e.g. an older Megatron without expert groups
            log.debug("topology: megatron gives no %s: %r", dim, exc)
            continue
        if size >= 1 and 0 <= index < size:
            coords[dim], sizes[dim] = index, size
    return coords, sizes


def coords_from_mesh_dims(
    names: Sequence[str | None] | None, coordinate: Sequence[int], shape: Sequence[int]
) -> tuple[dict[str, int], dict[str, int]]:
    """Map a DeviceMesh's named dimensions onto tp/pp/dp/cp/ep.

    A dimension named exactly ``tp``/``pp``/``dp``/``cp``/``ep`` wins over an alias for it;
    ``dp_replicate``/``ddp`` and ``dp_shard``/``fsdp`` combine into ``dp``; other names are
    ignored (debug log).

    >>> coords_from_mesh_dims(("dp_replicate", "dp_shard", "tp"), (1, 2, 0), (2, 4, 2))
    ({'tp': 0, 'dp': 6}, {'tp': 2, 'dp': 8})
    """
    coords: dict[str, int] = {}
    sizes: dict[str, int] = {}
    if not names:
        return coords, sizes
    named = [(n, c, s) for n, c, s in zip(names, coordinate, shape, strict=True) if n]
    replicate: tuple[int, int] = (0, 1)
    shard: tuple[int, int] = (0, 1)
    has_dp_parts = False
    # Exact names first so an alias never overrides them, whatever the mesh order.
    for name, index, size in sorted(named, key=lambda item: item[0] not in DIMS):
        if name in DP_REPLICATE_NAMES or name in DP_SHARD_NAMES:
            if name in DP_REPLICATE_NAMES:
                replicate = (index, size)
            else:
                shard = (index, size)
            has_dp_parts = True
            continue
        dim = name if name in DIMS else MESH_ALIASES.get(name)
        if dim is None:
            log.debug("topology: device mesh dimension %r is not a parallel dimension", name)
        elif dim in coords:
            log.debug("topology: device mesh dimension %r ignored: %s is already known", name, dim)
        else:
            coords[dim], sizes[dim] = index, size
    if has_dp_parts:
        if "dp" in coords:
            log.debug("topology: dp_replicate/dp_shard ignored: the mesh names dp itself")
        else:
            coords["dp"] = replicate[0] * shard[1] + shard[0]
            sizes["dp"] = replicate[1] * shard[1]
    return coords, sizes


def live_place() -> dict[str, Any]:
    """Where this process sits, from what is live in it: the fields of a Topology
    (:meth:`Topology.discover <policy_engine.plan.topology.Topology.discover>`)."""
    launch = launcher_from_env(os.environ)
    rank, world = (launch.rank, launch.world) if launch else (0, 1)
    source = launch.source if launch else "single"

    live = _torch_distributed()
    if live is not None:
        if launch is not None and live != (rank, world):
            log.debug(
                "topology: %s says rank %d of %d but torch.distributed says %d of %d; "
                "using torch.distributed",
                source,
                rank,
                world,
                *live,
            )
        (rank, world), source = live, "torch.distributed"

    coords: dict[str, int] = {}
    sizes: dict[str, int] = {}
    parallel = _megatron()
    if parallel is not None:
        (coords, sizes), source = parallel, "megatron"

    local_rank, local_world, node = _place_on_node(launch, rank)
    return {"rank": rank, "world": world, "local_rank": local_rank, "node": node,
            "coords": coords, "sizes": sizes, "local_world": local_world, "source": source}


def _place_on_node(launch: _Launch | None, rank: int) -> tuple[int, int | None, int]:
    if launch is None or launch.local_rank is None:
        # Nothing says how processes spread over machines: one node, as `explain` assumes.
        return rank, None, 0
    local_world = launch.local_world
    if local_world is not None and launch.local_rank >= local_world:
        raise ValueError(
            f"{launch.source} environment gives local rank {launch.local_rank} "
            f"but {local_world} processes on the node"
        )
    if launch.node is not None:
        node = launch.node
    elif local_world:
        node = rank // local_world
    else:
        node = 0
    return launch.local_rank, local_world, node


def device_mesh_coords(device_mesh: Any, rank: int) -> tuple[dict[str, int],
                                                             dict[str, int]] | None:
    """The coordinates and sizes a torch ``DeviceMesh`` gives this process (None when the
    process is not in the mesh)."""
    coordinate = device_mesh.get_coordinate()
    if coordinate is None:
        log.debug("topology: rank %d is not in the device mesh", rank)
        return None
    shape = [int(device_mesh.size(i)) for i in range(device_mesh.ndim)]
    names = device_mesh.mesh_dim_names
    if not names:
        log.debug("topology: device mesh has no mesh_dim_names; no coordinates taken from it")
    return coords_from_mesh_dims(names, [int(c) for c in coordinate], shape)
