"""Topology discovery: every source, their precedence, and the policy mesh."""

from __future__ import annotations

import logging
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from policy_engine.language.values.mesh import coords_from_mesh, parse_mesh
from policy_engine.plan.discover import coords_from_mesh_dims
from policy_engine.plan.topology import Topology

LAUNCHER_PREFIXES = ("SLURM_", "OMPI_")
LAUNCHER_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No launcher variable from the machine running the tests leaks into them."""
    import os

    for name in list(os.environ):
        if name in LAUNCHER_NAMES or name.startswith(LAUNCHER_PREFIXES):
            monkeypatch.delenv(name)


@pytest.fixture
def setenv(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    def set_all(**values: object) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, str(value))

    return set_all


@pytest.fixture
def fake_world() -> Iterator[Callable[[int, int], Any]]:
    """Simulate one rank of a world in this process with torch's ``fake`` backend."""
    pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def init(rank: int, world: int) -> Any:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
        return dist

    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


def device_mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", shape, mesh_dim_names=names)


@pytest.fixture
def debug_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="policy_engine")
    return caplog


# --- single process and launchers ------------------------------------------------------


def test_single_process() -> None:
    topo = Topology.discover()
    assert (topo.rank, topo.world, topo.local_rank, topo.node) == (0, 1, 0, 0)
    assert topo.source == "single"
    assert dict(topo.coords) == {}


def test_single_process_with_mesh_of_one() -> None:
    topo = Topology.discover({"dp": 1, "tp": 1})
    assert dict(topo.coords) == {"dp": 0, "tp": 0}


def test_torchrun(setenv: Callable[..., None]) -> None:
    setenv(RANK=6, WORLD_SIZE=8, LOCAL_RANK=2, LOCAL_WORLD_SIZE=4, GROUP_RANK=1)
    topo = Topology.discover()
    assert (topo.rank, topo.world, topo.local_rank, topo.local_world, topo.node) == (
        6, 8, 2, 4, 1,
    )  # fmt: skip
    assert topo.source == "torchrun"
    assert topo.selector_sizes() == {"local_rank": 4, "node": 2}


def test_torchrun_node_from_local_world(setenv: Callable[..., None]) -> None:
    # verl's Ray workers export RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE, no GROUP_RANK.
    setenv(RANK=5, WORLD_SIZE=8, LOCAL_RANK=1, LOCAL_WORLD_SIZE=4)
    assert Topology.discover().node == 1


def test_env_without_local_rank_is_one_node(setenv: Callable[..., None]) -> None:
    setenv(RANK=3, WORLD_SIZE=4)
    topo = Topology.discover()
    assert (topo.local_rank, topo.node, topo.local_world) == (3, 0, None)
    assert attrs.evolve(topo, source="simulated") == Topology.for_rank(3, 4)  # as `explain`


def test_slurm(setenv: Callable[..., None]) -> None:
    setenv(SLURM_PROCID=9, SLURM_NTASKS=16, SLURM_LOCALID=1, SLURM_NODEID=4,
           SLURM_STEP_TASKS_PER_NODE="2(x8)")  # fmt: skip
    topo = Topology.discover()
    assert (topo.rank, topo.world, topo.local_rank, topo.node) == (9, 16, 1, 4)
    assert topo.local_world == 2
    assert topo.source == "slurm"


@pytest.mark.parametrize(
    ("tasks_per_node", "local_world"),
    [("4", 4), ("4(x2)", 4), ("4(x2),3", None), ("", None)],
)
def test_slurm_tasks_per_node(
    setenv: Callable[..., None], tasks_per_node: str, local_world: int | None
) -> None:
    setenv(SLURM_PROCID=0, SLURM_NTASKS=11, SLURM_LOCALID=0, SLURM_NODEID=0,
           SLURM_TASKS_PER_NODE=tasks_per_node)  # fmt: skip
    assert Topology.discover().local_world == local_world


def test_slurm_batch_script_is_not_a_task(setenv: Callable[..., None]) -> None:
    setenv(SLURM_JOB_ID=123, SLURM_NODEID=0)
    assert Topology.discover().source == "single"


def test_openmpi(setenv: Callable[..., None]) -> None:
    setenv(OMPI_COMM_WORLD_RANK=13, OMPI_COMM_WORLD_SIZE=16,
           OMPI_COMM_WORLD_LOCAL_RANK=1, OMPI_COMM_WORLD_LOCAL_SIZE=4)  # fmt: skip
    topo = Topology.discover()
    assert (topo.rank, topo.world, topo.local_rank, topo.node) == (13, 16, 1, 3)
    assert topo.source == "openmpi"


def test_torchrun_under_srun_wins(
    setenv: Callable[..., None], debug_log: pytest.LogCaptureFixture
) -> None:
    # `srun torchrun ...`: Slurm counts one task per node, torchrun counts the workers.
    setenv(SLURM_PROCID=1, SLURM_NTASKS=2, SLURM_LOCALID=0, SLURM_NODEID=1,
           RANK=5, WORLD_SIZE=8, LOCAL_RANK=1, LOCAL_WORLD_SIZE=4, GROUP_RANK=1)  # fmt: skip
    topo = Topology.discover()
    assert (topo.rank, topo.world, topo.source) == (5, 8, "torchrun")
    assert "torchrun says rank 5 of 8, slurm says rank 1 of 2; using torchrun" in debug_log.text


def test_slurm_wins_over_openmpi(setenv: Callable[..., None]) -> None:
    setenv(SLURM_PROCID=2, SLURM_NTASKS=4, OMPI_COMM_WORLD_RANK=2, OMPI_COMM_WORLD_SIZE=4)
    assert Topology.discover().source == "slurm"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "abc", "WORLD_SIZE": "4"}, "environment variable RANK='abc' is not an integer"),
        (
            {"RANK": "0", "WORLD_SIZE": "0"},
            "environment variable WORLD_SIZE='0' must be at least 1",
        ),
        ({"RANK": "-1", "WORLD_SIZE": "4"}, "environment variable RANK='-1' must be at least 0"),
        ({"RANK": "2"}, "environment variable RANK is set but WORLD_SIZE is not"),
        ({"WORLD_SIZE": "2"}, "environment variable WORLD_SIZE is set but RANK is not"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "torchrun environment gives rank 4 but a world of 4"),
        (
            {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
            "torchrun environment gives local rank 2 but 2 processes on the node",
        ),
        (
            {"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_NODEID": "n1"},
            "environment variable SLURM_NODEID='n1' is not an integer",
        ),
        (
            {"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "4"},
            "environment variable OMPI_COMM_WORLD_RANK='x' is not an integer",
        ),
    ],
)
def test_malformed_environment(
    setenv: Callable[..., None], env: dict[str, str], message: str
) -> None:
    setenv(**env)
    with pytest.raises(ValueError) as info:
        Topology.discover()
    assert str(info.value) == message


# --- the policy mesh --------------------------------------------------------------------


def test_coordinates_from_policy_mesh(setenv: Callable[..., None]) -> None:
    setenv(RANK=5, WORLD_SIZE=8)
    topo = Topology.discover({"pp": 2, "dp": 2, "tp": 2})
    assert dict(topo.coords) == {"pp": 1, "dp": 0, "tp": 1}
    assert dict(topo.sizes) == {"pp": 2, "dp": 2, "tp": 2}


def test_policy_mesh_mismatch_names_both_numbers(setenv: Callable[..., None]) -> None:
    setenv(RANK=5, WORLD_SIZE=8)
    with pytest.raises(ValueError, match=r"mesh dp=2,tp=2 has 4 ranks but the world has 8"):
        Topology.discover({"dp": 2, "tp": 2})


def test_policy_mesh_on_a_single_process_is_a_mismatch() -> None:
    with pytest.raises(ValueError, match=r"has 8 ranks but the world has 1"):
        Topology.discover(parse_mesh("pp=2,dp=2,tp=2"))


# --- torch.distributed ------------------------------------------------------------------


def test_torch_distributed(fake_world: Callable[[int, int], Any]) -> None:
    fake_world(5, 8)
    topo = Topology.discover()
    assert (topo.rank, topo.world, topo.source) == (5, 8, "torch.distributed")


def test_torch_distributed_wins_over_env(
    fake_world: Callable[[int, int], Any],
    setenv: Callable[..., None],
    debug_log: pytest.LogCaptureFixture,
) -> None:
    setenv(RANK=3, WORLD_SIZE=8, LOCAL_RANK=1, LOCAL_WORLD_SIZE=2, GROUP_RANK=1)
    fake_world(5, 8)
    topo = Topology.discover()
    assert (topo.rank, topo.world, topo.source) == (5, 8, "torch.distributed")
    # Only the launcher knows how processes spread over machines.
    assert (topo.local_rank, topo.node, topo.local_world) == (1, 1, 2)
    assert (
        "torchrun says rank 3 of 8 but torch.distributed says 5 of 8; using torch.distributed"
        in debug_log.text
    )


def test_discovery_never_initializes_a_process_group(setenv: Callable[..., None]) -> None:
    dist = pytest.importorskip("torch.distributed")
    setenv(RANK=1, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=1)
    Topology.discover()
    assert not dist.is_initialized()


def test_discovery_imports_neither_torch_nor_megatron() -> None:
    code = (
        "import sys; from policy_engine.plan.topology import Topology; Topology.discover(); "
        "assert not {'torch', 'megatron'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- DeviceMesh -------------------------------------------------------------------------

MESH_CASES = [
    ((2, 2, 2), ("pp", "dp", "tp")),
    ((2, 4), ("dp", "tp")),
    ((2, 2, 4), ("pp", "dp", "tp")),
    ((4, 2, 2, 2), ("dp", "pp", "cp", "tp")),
    ((2, 2, 2, 2, 4), ("pp", "dp", "cp", "ep", "tp")),
]


@pytest.mark.parametrize(("shape", "names"), MESH_CASES)
@pytest.mark.parametrize("pick", [0, 5, -1])
def test_device_mesh_agrees_with_explain(
    fake_world: Callable[[int, int], Any],
    shape: tuple[int, ...],
    names: tuple[str, ...],
    pick: int,
) -> None:
    """What a live rank finds equals what `explain` predicts from the same mesh (8-64 ranks)."""
    mesh = dict(zip(names, shape, strict=True))
    world = 1
    for size in shape:
        world *= size
    rank = pick % world
    fake_world(rank, world)
    topo = Topology.from_device_mesh(device_mesh(shape, names))
    assert topo.source == "device_mesh"
    assert (topo.rank, topo.world) == (rank, world)
    predicted = Topology.for_rank(rank, world, mesh)
    assert dict(topo.coords) == dict(predicted.coords) == coords_from_mesh(rank, mesh)
    assert dict(topo.sizes) == mesh
    # The policy mesh on top changes nothing it already knows.
    assert topo.with_mesh(mesh).coords == topo.coords


def test_device_mesh_hsdp_combines_into_dp(fake_world: Callable[[int, int], Any]) -> None:
    fake_world(5, 8)
    topo = Topology.from_device_mesh(device_mesh((2, 2, 2), ("dp_replicate", "dp_shard", "tp")))
    # replicate 1, shard 0 -> dp 1 * 2 + 0 = 2 of 4
    assert dict(topo.coords) == {"dp": 2, "tp": 1}
    assert dict(topo.sizes) == {"dp": 4, "tp": 2}


def test_device_mesh_verl_names(fake_world: Callable[[int, int], Any]) -> None:
    fake_world(13, 16)
    assert dict(Topology.from_device_mesh(device_mesh((4, 4), ("ddp", "fsdp"))).coords) == {
        "dp": 13
    }
    assert dict(Topology.from_device_mesh(device_mesh((4, 4), ("dp", "sp"))).coords) == {
        "dp": 3,
        "cp": 1,
    }
    assert dict(Topology.from_device_mesh(device_mesh((8, 2), ("dp", "infer_tp"))).coords) == {
        "dp": 6,
        "tp": 1,
    }


def test_device_mesh_unknown_and_missing_names(
    fake_world: Callable[[int, int], Any], debug_log: pytest.LogCaptureFixture
) -> None:
    fake_world(5, 8)
    topo = Topology.from_device_mesh(device_mesh((4, 2), ("batch", "tp")))
    assert dict(topo.coords) == {"tp": 1}
    assert "device mesh dimension 'batch' is not a parallel dimension" in debug_log.text
    from torch.distributed.device_mesh import init_device_mesh

    unnamed = Topology.from_device_mesh(init_device_mesh("cpu", (8,)))
    assert (unnamed.rank, dict(unnamed.coords)) == (5, {})


def test_rank_outside_the_device_mesh(
    fake_world: Callable[[int, int], Any], debug_log: pytest.LogCaptureFixture
) -> None:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    fake_world(5, 8)
    mesh = DeviceMesh("cpu", torch.tensor([[0, 1], [2, 3]]), mesh_dim_names=("dp", "tp"))
    topo = Topology.from_device_mesh(mesh)
    assert (topo.rank, dict(topo.coords), topo.source) == (5, {}, "torch.distributed")
    assert "rank 5 is not in the device mesh" in debug_log.text


def test_device_mesh_keeps_launcher_place(
    fake_world: Callable[[int, int], Any], setenv: Callable[..., None]
) -> None:
    setenv(RANK=5, WORLD_SIZE=8, LOCAL_RANK=1, LOCAL_WORLD_SIZE=4, GROUP_RANK=1)
    fake_world(5, 8)
    topo = Topology.from_device_mesh(device_mesh((2, 4), ("dp", "tp")))
    assert (topo.local_rank, topo.node) == (1, 1)
    assert topo.selector_coords() == {"dp": 1, "tp": 1, "local_rank": 1, "node": 1}


@pytest.mark.parametrize(
    ("names", "coords", "sizes"),
    [
        (("dp", "dp_shard", "tp"), {"dp": 1, "tp": 1}, {"dp": 2, "tp": 2}),
        (("sp", "cp", "tp"), {"cp": 0, "tp": 1}, {"cp": 2, "tp": 2}),
        (("fsdp", "ep", "tp"), {"dp": 1, "ep": 0, "tp": 1}, {"dp": 2, "ep": 2, "tp": 2}),
        # replicate-major whatever the order: replicate 0, shard 1 -> dp 0 * 2 + 1
        (("dp_shard", "dp_replicate", "tp"), {"dp": 1, "tp": 1}, {"dp": 4, "tp": 2}),
    ],
)
def test_mesh_name_precedence(
    names: tuple[str, ...], coords: dict[str, int], sizes: dict[str, int]
) -> None:
    # rank 5 of (2, 2, 2): coordinate (1, 0, 1)
    assert coords_from_mesh_dims(names, (1, 0, 1), (2, 2, 2)) == (coords, sizes)


@given(
    replicate=st.integers(1, 4),
    shard=st.integers(1, 8),
    tp=st.integers(1, 4),
    data=st.data(),
)
def test_hsdp_dp_is_the_flattened_dp(replicate: int, shard: int, tp: int, data: Any) -> None:
    """dp from (dp_replicate, dp_shard) is the coordinate in the flattened {dp, tp} mesh."""
    world = replicate * shard * tp
    rank = data.draw(st.integers(0, world - 1))
    full = coords_from_mesh(rank, {"dp_replicate": replicate, "dp_shard": shard, "tp": tp})
    names = ("dp_replicate", "dp_shard", "tp")
    coords, sizes = coords_from_mesh_dims(names, [full[n] for n in names], (replicate, shard, tp))
    assert coords == coords_from_mesh(rank, {"dp": replicate * shard, "tp": tp})
    assert sizes == {"dp": replicate * shard, "tp": tp}


# --- Megatron ---------------------------------------------------------------------------


def fake_parallel_state(**groups: tuple[int, int]) -> types.ModuleType:
    """A stand-in for megatron.core.parallel_state with its documented getters."""
    state = types.ModuleType("megatron.core.parallel_state")
    state.model_parallel_is_initialized = lambda: True  # type: ignore[attr-defined]
    for group, (index, size) in groups.items():
        setattr(state, f"get_{group}_rank", lambda index=index: index)
        setattr(state, f"get_{group}_world_size", lambda size=size: size)
    return state


@pytest.fixture
def megatron(monkeypatch: pytest.MonkeyPatch) -> Callable[[types.ModuleType], None]:
    def install(state: types.ModuleType) -> None:
        monkeypatch.setitem(sys.modules, "megatron", types.ModuleType("megatron"))
        monkeypatch.setitem(sys.modules, "megatron.core", types.ModuleType("megatron.core"))
        monkeypatch.setitem(sys.modules, "megatron.core.parallel_state", state)

    return install


MEGATRON_16 = {
    "tensor_model_parallel": (1, 2),
    "pipeline_model_parallel": (1, 2),
    "data_parallel": (0, 2),
    "context_parallel": (1, 2),
    "expert_model_parallel": (0, 1),
}


def test_megatron(
    fake_world: Callable[[int, int], Any], megatron: Callable[[types.ModuleType], None]
) -> None:
    fake_world(11, 16)
    megatron(fake_parallel_state(**MEGATRON_16))
    topo = Topology.discover()
    assert (topo.rank, topo.world, topo.source) == (11, 16, "megatron")
    assert dict(topo.coords) == {"tp": 1, "pp": 1, "dp": 0, "cp": 1, "ep": 0}
    assert dict(topo.sizes) == {"tp": 2, "pp": 2, "dp": 2, "cp": 2, "ep": 1}


def test_megatron_not_initialized_is_ignored(
    fake_world: Callable[[int, int], Any], megatron: Callable[[types.ModuleType], None]
) -> None:
    fake_world(3, 4)
    state = fake_parallel_state(tensor_model_parallel=(1, 2))
    state.model_parallel_is_initialized = lambda: False  # type: ignore[attr-defined]
    megatron(state)
    assert Topology.discover().source == "torch.distributed"


def test_megatron_without_expert_getters(
    fake_world: Callable[[int, int], Any], megatron: Callable[[types.ModuleType], None]
) -> None:
    # Older Megatron releases have no expert groups: the rest still counts.
    fake_world(3, 4)
    megatron(fake_parallel_state(tensor_model_parallel=(1, 2), data_parallel=(1, 2)))
    assert dict(Topology.discover().coords) == {"tp": 1, "dp": 1}


def test_megatron_only_read_when_parallel_state_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "megatron", types.ModuleType("megatron"))
    monkeypatch.delitem(sys.modules, "megatron.core.parallel_state", raising=False)
    assert Topology.discover().source == "single"
    assert "megatron.core.parallel_state" not in sys.modules


def test_megatron_wins_over_policy_mesh(
    fake_world: Callable[[int, int], Any],
    megatron: Callable[[types.ModuleType], None],
    debug_log: pytest.LogCaptureFixture,
) -> None:
    fake_world(5, 8)
    megatron(fake_parallel_state(tensor_model_parallel=(1, 2), data_parallel=(0, 4)))
    # The file says dp=2, pp=2; Megatron knows dp=4 and has no pp group here.
    topo = Topology.discover({"pp": 2, "dp": 2, "tp": 2})
    assert dict(topo.coords) == {"tp": 1, "dp": 0, "pp": 1}
    assert topo.sizes["dp"] == 4
    assert "policy mesh says dp=2 but megatron says 4; using megatron" in debug_log.text


def test_device_mesh_wins_over_megatron(
    fake_world: Callable[[int, int], Any],
    megatron: Callable[[types.ModuleType], None],
    debug_log: pytest.LogCaptureFixture,
) -> None:
    fake_world(5, 8)
    megatron(fake_parallel_state(tensor_model_parallel=(0, 2), context_parallel=(1, 2)))
    topo = Topology.from_device_mesh(device_mesh((4, 2), ("dp", "tp")))
    assert topo.source == "device_mesh"
    assert dict(topo.coords) == {"tp": 1, "cp": 1, "dp": 2}
    assert "megatron says tp=0 but the device mesh says 1; using the device mesh" in debug_log.text


@pytest.mark.parametrize("rank", [0, 5, 11, 15])
def test_real_megatron_parallel_state(fake_world: Callable[[int, int], Any], rank: int) -> None:
    """megatron-core's own parallel_state, on CPU with the fake backend (when installed).

    Megatron's default order "tp-cp-ep-dp-pp" is the policy mesh {pp, dp, cp, tp}.
    """
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
        state = pytest.importorskip("megatron.core.parallel_state")
    fake_world(rank, 16)
    state.initialize_model_parallel(
        tensor_model_parallel_size=2,
        pipeline_model_parallel_size=2,
        context_parallel_size=2,
        create_gloo_process_groups=False,
    )
    try:
        topo = Topology.discover()
    finally:
        state.destroy_model_parallel()
    mesh = {"pp": 2, "dp": 2, "cp": 2, "tp": 2}
    assert topo.source == "megatron"
    assert {d: topo.coords[d] for d in mesh} == coords_from_mesh(rank, mesh)
    assert (topo.coords["ep"], topo.sizes["ep"]) == (0, 1)
