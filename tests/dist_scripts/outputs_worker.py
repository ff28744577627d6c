"""One rank of a 2-process torchrun job (gloo) for the output tests: a small model whose
gradients are all-reduced every step, profiled as its policy says.

Usage: outputs_worker.py POLICY STEPS
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from policy_engine import apply_policy, load_policy


class Trainer:
    def __init__(self) -> None:
        self.model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                         torch.nn.Linear(128, 8))
        self.optim = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def update_actor(self) -> None:
        loss = self.model(torch.randn(32, 64)).pow(2).mean()
        self.optim.zero_grad()
        loss.backward()
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
        self.optim.step()


def main() -> None:
    dist.init_process_group("gloo")
    trainer = Trainer()
    prof = apply_policy(trainer, role="trainer", policy=load_policy(sys.argv[1]))
    for step in range(1, int(sys.argv[2]) + 1):
        with prof.training_step(step):
            for _ in range(2):
                trainer.update_actor()
                prof.step()
    prof.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
