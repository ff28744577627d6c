"""One rank of a tiny torchrun job that profiles only as its policy says.

Usage: train_worker.py POLICY REPORT_DIR [--mesh dp,tp] [--steps N] [--linger S]

It writes REPORT_DIR/rank<r>.json with what the engine saw and did. ``--linger S`` makes a
profiled rank stay inside its last profiled step until every rank that does not profile
has finished its loop (each says so in REPORT_DIR), at most S seconds: a rank that does
not profile shows it never waits for one that does, whatever the machine's load. Every
torch.distributed collective is replaced by a recorder while the engine runs: the engine
must call none.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from policy_engine import Topology, apply_policy, load_policy

COLLECTIVES = (
    "all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce", "all_to_all",
    "barrier", "broadcast", "broadcast_object_list", "gather", "gather_object",
    "monitored_barrier", "reduce", "reduce_scatter", "scatter", "scatter_object_list",
    "send", "recv", "isend", "irecv",
)  # fmt: skip


class Worker:
    """Stands in for a verl worker: a model and a stage method the policy names."""

    def __init__(self) -> None:
        self.model = torch.nn.Linear(16, 4)
        self.optim = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def update_actor(self) -> float:
        loss = self.model(torch.randn(8, 16)).pow(2).mean()
        self.optim.zero_grad()
        loss.backward()
        self.optim.step()
        return float(loss.detach())


def record_collectives() -> tuple[list[str], dict[str, Any]]:
    calls: list[str] = []
    saved = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}

    def recorder(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> None:
            calls.append(name)
            raise RuntimeError(f"the engine called torch.distributed.{name}")

        return call

    for name in saved:
        setattr(dist, name, recorder(name))
    return calls, saved


def others_finished(folder: Path, world: int, limit: float) -> bool:
    """Wait until every rank that does not profile has finished its loop (True), or
    ``limit`` seconds (False)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        plans = {r: folder / f"plan{r}" for r in range(world)}
        if all(p.exists() for p in plans.values()):
            idle = [r for r, p in plans.items() if p.read_text() == "0"]
            if all((folder / f"finished{r}").exists() for r in idle):
                return True
        time.sleep(0.02)
    return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("policy")
    parser.add_argument("report_dir", type=Path)
    parser.add_argument("--mesh", help="dimension names of a DeviceMesh, e.g. dp,tp")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--linger", type=float, default=0.0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    if args.mesh:
        from torch.distributed.device_mesh import init_device_mesh

        names = tuple(args.mesh.split(","))
        shape = (dist.get_world_size() // 2, 2)
        topology = Topology.from_device_mesh(init_device_mesh("cpu", shape, mesh_dim_names=names))
    else:
        topology = None  # the engine discovers it

    calls, saved = record_collectives()
    worker = Worker()
    prof = apply_policy(worker, role="actor", policy=load_policy(args.policy), topology=topology)
    rank, world = dist.get_rank(), dist.get_world_size()
    args.report_dir.mkdir(parents=True, exist_ok=True)
    said = args.report_dir / f".plan{rank}"
    said.write_text(str(int(prof.plan.enabled)))
    said.replace(args.report_dir / f"plan{rank}")  # whole when seen
    lingered_until = None
    waited_out = False
    last_profiled = max(prof.plan.steps.within(1, args.steps), default=None)
    for step in range(1, args.steps + 1):
        with prof.training_step(step):
            for _ in range(2):
                worker.update_actor()
                prof.step()
            if args.linger and prof.plan.enabled and step == last_profiled:
                waited_out = not others_finished(args.report_dir, world, args.linger)
                lingered_until = time.time()
    finished = time.time()
    if not prof.plan.enabled:
        (args.report_dir / f"finished{rank}").touch()
    prof.close()
    for name, fn in saved.items():
        setattr(dist, name, fn)

    report = {
        "rank": rank,
        "pid": os.getpid(),
        "topology": (topology or Topology.discover()).to_json(),
        "plan_coords": dict(prof.plan.coords),
        "profiled": prof.plan.enabled,
        "collectives": calls,
        "lingered_until": lingered_until,
        "waited_out": waited_out,
        "finished": finished,
    }
    (args.report_dir / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
