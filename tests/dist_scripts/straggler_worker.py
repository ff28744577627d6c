"""One rank of a torchrun job (gloo, CPU) for the analysis tests: every inner step
computes, then all-reduces its gradients; the rank named SLOW (or none, with -1) also
computes for EXTRA_MS more before the all-reduce, so the others wait for it.

Usage: straggler_worker.py POLICY STEPS SLOW EXTRA_MS [FOLDER]

FOLDER (e.g. ``node{rank}``): each rank writes under a folder of its own, as ranks on
separate hosts write to their node-local disks. EXTRA_MM=N in the environment: every rank
does N more 256x256 matrix multiplications in each update_actor (a change to compare);
INNER_STEPS=N: N inner steps per training step (default 4).
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

from policy_engine import apply_policy, load_policy

# inner steps (prof.step() calls) per training step; INNER_STEPS=N in the environment
INNER = int(os.environ.get("INNER_STEPS", "4"))


class Trainer:
    def __init__(self, extra: float) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(),
                                         torch.nn.Linear(256, 16))
        self.optim = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.extra = extra
        self.spare = torch.randn(128, 128)
        self.mm = int(os.environ.get("EXTRA_MM", "0"))
        self.square = torch.randn(256, 256) / 16

    def update_actor(self) -> None:
        loss = self.model(torch.randn(64, 128)).pow(2).mean()
        self.optim.zero_grad()
        loss.backward()
        for _ in range(self.mm):
            torch.mm(self.square, self.square)
        if self.extra:
            # Work measured in time, not in operations: however loaded the machine is,
            # this rank reaches the all-reduce that much later.
            until = time.perf_counter() + self.extra
            while time.perf_counter() < until:
                self.spare = torch.tanh(self.spare @ self.spare)
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
        self.optim.step()


def main() -> None:
    policy, steps, slow, extra_ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
        float(sys.argv[4])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    trainer = Trainer(extra_ms / 1000 if rank == slow else 0.0)
    overrides = [f"output_dir={sys.argv[5].format(rank=rank)}"] if len(sys.argv) > 5 else []
    prof = apply_policy(trainer, role="trainer",
                        policy=load_policy(policy, overrides=overrides))
    for step in range(1, steps + 1):
        with prof.training_step(step):
            for _ in range(INNER):
                trainer.update_actor()
                prof.step()
    prof.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
