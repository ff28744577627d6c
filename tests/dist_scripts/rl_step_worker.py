"""One rank of a verl-shaped RL job under torchrun (gloo, CPU): the actor and its ref
colocated on ranks 0-1, the rollout on ranks 2-3, each stage a method named as verl names
it, wrapped as a region by the policy.

Each training step: the rollout ranks generate (GEN_MS of work, ending in an all-reduce
between them, as an engine's ranks end a batch together) and send the batch, rank 2 to
rank 0 and rank 3 to rank 1; the trainer ranks wait for it in a collective (a
``recv``, outside any region), compute the ref's log-probs (REF_MS), update the actor
(UPD_MS, then an all-reduce of its gradients between ranks 0 and 1) and send the new
weights back; the rollout ranks take them in ``sync_weights``, which begins by waiting for
them.

Usage: rl_step_worker.py POLICY STEPS [SHIFTED_RANK SECONDS]

SHIFTED_RANK SECONDS: that rank's clock is moved by SECONDS (the test setting
POLICY_ENGINE_TEST_CLOCK_SHIFT, set before the policy is applied).
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

from policy_engine import apply_policy, load_policy

GEN_MS, REF_MS, UPD_MS = 1000, 120, 250


def busy(ms: float) -> None:
    """Work measured in time, not in operations: however loaded the machine is, a stage
    takes this long."""
    spare = torch.randn(64, 64)
    until = time.perf_counter() + ms / 1000
    while time.perf_counter() < until:
        spare = torch.tanh(spare @ spare)


class Rollout:
    def __init__(self, rank: int, group: dist.ProcessGroup) -> None:
        self.peer = rank - 2
        self.group = group
        self.weights = torch.zeros(1024)

    def generate_sequences(self) -> torch.Tensor:
        busy(GEN_MS)
        batch = torch.full((1024,), float(self.peer))
        dist.all_reduce(batch, group=self.group)  # the engine's ranks end together
        return batch

    def sync_weights(self) -> None:
        dist.recv(self.weights, src=self.peer)
        busy(5)


class Ref:
    def ref_compute_log_prob(self, batch: torch.Tensor) -> torch.Tensor:
        busy(REF_MS)
        return batch * 0.5


class Actor:
    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.weights = torch.zeros(1024)

    def actor_update(self, batch: torch.Tensor) -> None:
        busy(UPD_MS)
        grad = batch.clone()
        dist.all_reduce(grad, group=self.group)
        self.weights += grad


def main() -> None:
    policy, steps = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if len(sys.argv) > 4 and rank == int(sys.argv[3]):
        os.environ["POLICY_ENGINE_TEST_CLOCK_SHIFT"] = sys.argv[4]
    trainers, rollouts = dist.new_group([0, 1]), dist.new_group([2, 3])
    loaded = load_policy(policy)
    if rank < 2:
        actor, ref = Actor(trainers), Ref()
        profs = [apply_policy(actor, role="actor", policy=loaded),
                 apply_policy(ref, role="ref", policy=loaded)]
    else:
        rollout = Rollout(rank, rollouts)
        profs = [apply_policy(rollout, role="rollout", policy=loaded)]
    # kineto's first start in a process takes seconds on a loaded machine, which a long
    # job's profiled steps come well after: started once here, as it would have been
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        pass
    for step in range(1, steps + 1):
        blocks = [p.training_step(step) for p in profs]
        for block in blocks:
            block.__enter__()
        if rank < 2:
            batch = torch.zeros(1024)
            dist.recv(batch, src=rank + 2)  # the trainer waits for the rollout's batch
            ref.ref_compute_log_prob(batch)
            actor.actor_update(batch)
            dist.send(actor.weights, dst=rank + 2)
        else:
            dist.send(rollout.generate_sequences(), dst=rank - 2)
            rollout.sync_weights()
        for block in reversed(blocks):
            block.__exit__(None, None, None)
    for p in profs:
        p.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
