"""One rank of ``policy-engine demo``'s job, started by torchrun (gloo, CPU).

Every rank holds rollout, actor and ref in one process, as verl's hybrid engine places
them, and runs a GRPO-shaped step: the rollout generates a batch, the actor and the ref
compute log probabilities, the actor updates over mini-batches, all-reducing its
gradients with the other ranks after each one (``prof.step()`` after each: an inner
step). The slow rank computes that much longer before each all-reduce, so the others wait
for it there. Rank 0 prints a line per step.

Usage (what ``policy-engine demo`` runs): ``torchrun --standalone --nproc-per-node=N -m
policy_engine.cli.demo_job --out DIR --steps S --mini-batches M --slow-rank R --slow-ms MS
[--policy FILE]``
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Sequence

from policy_engine.cli import ppo
from policy_engine.language.model import Policy
from policy_engine.plan.topology import Topology

#: Sequences per mini-batch on each rank.
PER_MINI_BATCH = 2


def train(policy: Policy, *, steps: int, mini_batches: int, slow: float) -> float:
    """This rank's part of the job: ``steps`` training steps under ``policy``, ``slow``
    seconds more compute before each all-reduce; the actor's last loss."""
    import torch

    topo = Topology.discover()
    rollout, actor = ppo.Rollout(policy, topo), ppo.Actor(policy, topo)
    ref = ppo.Ref(policy, topo)
    actor.slow = slow
    # The same weights on every rank (each worker seeds 0), a batch of its own on each.
    torch.manual_seed(1 + topo.rank)
    profilers = [w.prof for w in (rollout, actor, ref)]
    loss = 0.0
    for step in range(1, steps + 1):
        began = time.perf_counter()
        with contextlib.ExitStack() as stack:
            for prof in profilers:
                stack.enter_context(prof.training_step(step))
            prompts = torch.randint(0, ppo.VOCAB, (PER_MINI_BATCH * mini_batches, 4))
            tokens = rollout.generate_sequences(prompts)
            old = actor.compute_log_prob(tokens)
            ref_logp = ref.compute_ref_log_prob(tokens)
            # No critic: each reward less the batch's mean is the advantage, as in GRPO.
            reward = (tokens[:, -1] % 2).float()
            loss = actor.update_actor(tokens, old, ref_logp, reward - reward.mean(),
                                      mini_batches=mini_batches)
        if topo.rank == 0:
            print(f"rank 0: step {step} in {time.perf_counter() - began:.2f} s, "
                  f"actor loss {loss:.3f}", flush=True)
    for prof in profilers:
        prof.close()
    return loss


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="policy_engine.cli.demo_job",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--policy", metavar="FILE")
    parser.add_argument("--out", required=True, metavar="DIR")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--mini-batches", type=int, required=True)
    parser.add_argument("--slow-rank", type=int, required=True)
    parser.add_argument("--slow-ms", type=float, required=True)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    from torch.distributed.elastic.multiprocessing.errors import record

    # A rank's exception reaches torchrun's account of the failure, traceback and all.
    record(_rank)(_args(argv))


def _rank(args: argparse.Namespace) -> None:
    die_with_parent()
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        policy, _ = ppo.demo_policy(args.policy, args.out, ppo.JOB_POLICY)
        slow = args.slow_ms / 1000 if dist.get_rank() == args.slow_rank else 0.0
        train(policy, steps=args.steps, mini_batches=args.mini_batches, slow=slow)
    finally:
        dist.destroy_process_group()


def die_with_parent() -> None:
    """SIGTERM to this process when its parent dies (Linux): torchrun when the demo is
    killed outright, each rank when torchrun is, so that no process of the job outlives
    the command."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before the call
        os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    main(sys.argv[1:])
