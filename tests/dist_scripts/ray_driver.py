"""A verl-like driver on a local Ray cluster: worker actors for two roles.

Usage: ray_driver.py POLICY REPORT_FILE

Each actor is told its rank by the driver (Ray numbers nothing itself) and calls
``apply_policy(self, role=..., topology=Topology(rank=..., world=...))`` in its
constructor. The driver writes what every actor reported to REPORT_FILE as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import ray
from ray_start import start_ray  # this folder: the script's own

ROLES = {"actor": 2, "rollout": 2}  # role -> world size of its worker group


@ray.remote(num_cpus=0)  # four actors on a two-CPU cluster: none may wait for a slot
class Worker:
    def __init__(self, role: str, rank: int, world: int, policy: str) -> None:
        import torch

        from policy_engine import Topology, apply_policy, load_policy

        self.role = role
        self.model = torch.nn.Linear(16, 4)
        self.prof = apply_policy(
            self, role=role, policy=load_policy(policy), topology=Topology(rank=rank, world=world)
        )

    def update_actor(self) -> None:
        self.model(__import__("torch").randn(8, 16)).sum().backward()

    def generate_sequences(self) -> None:
        with __import__("torch").no_grad():
            self.model(__import__("torch").randn(8, 16))

    def train(self, step: int) -> None:
        stage = self.update_actor if self.role == "actor" else self.generate_sequences
        with self.prof.training_step(step):
            for _ in range(2):
                stage()
                self.prof.step()

    def finish(self) -> dict[str, Any]:
        self.prof.close()
        plan = self.prof.plan
        return {"role": self.role, "rank": plan.rank, "world": plan.world,
                "profiled": plan.enabled, "pid": os.getpid()}  # fmt: skip


def main() -> None:
    policy, report_file = sys.argv[1:3]
    start_ray(num_cpus=2, include_dashboard=False,
              _node_ip_address="127.0.0.1",  # loopback only
              log_to_driver=False, configure_logging=False)
    try:
        workers = [
            Worker.remote(role, rank, world, policy)  # type: ignore[attr-defined]
            for role, world in ROLES.items()
            for rank in range(world)
        ]
        for step in (1, 2, 3):
            ray.get([w.train.remote(step) for w in workers])
        reports = ray.get([w.finish.remote() for w in workers])
    finally:
        ray.shutdown()
    with open(report_file, "w") as out:
        json.dump(reports, out)


if __name__ == "__main__":
    main()
