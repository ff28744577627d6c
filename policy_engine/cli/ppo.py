"""A small CPU stand-in for a verl PPO step, run under a policy: ``policy-engine demo``.

Four workers live in one process as in verl's colocated hybrid engine: rollout, actor,
ref and critic, each a tiny model. Each training step generates a batch, computes log
probabilities and values, then updates the critic and the actor over mini-batches,
calling ``prof.step()`` after each mini-batch. In the demo's job
(:mod:`policy_engine.cli.demo_job`) each rank holds the rollout, actor and ref, and the
actor all-reduces its gradients across the ranks after each mini-batch, as data-parallel
training does.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Any

import attrs

from policy_engine._resources import read_resource
from policy_engine.language.load import load_policy
from policy_engine.language.model import Policy
from policy_engine.language.read.source import parse_document
from policy_engine.plan.topology import Topology
from policy_engine.runtime.apply import Profiler, apply_policy

HIDDEN = 64
VOCAB = 128
#: The roles the demo runs, one worker each.
ROLES = ("rollout", "actor", "ref", "critic")
#: The built-in policies: the one-process demo's, and the job's (every rank profiled).
DEFAULT_POLICY = "verl_ppo.yaml"
JOB_POLICY = "demo.yaml"


def demo_policy(path: str | None, out: str, builtin: str) -> tuple[Policy, str]:
    """The policy the demo runs, writing under ``out``: the file at ``path``, else the
    built-in ``builtin``; and how to name it."""
    if path:
        return load_policy(path, overrides=[f"output_dir={out}"]), path
    text = read_resource(f"_policies/{builtin}", f"policies/{builtin}")
    data = parse_document(text, f"<built-in {builtin}>", "yaml").data
    data["output_dir"] = out
    label = f"built-in {builtin}"
    # A mapping has no file: the manifests and the report name the example instead.
    return attrs.evolve(load_policy(data), source=label), label


class _Worker:
    role = "worker"

    def __init__(self, policy: Policy, topology: Topology) -> None:
        import torch

        torch.manual_seed(0)
        self.torch = torch
        self.model = torch.nn.Sequential(
            torch.nn.Embedding(VOCAB, HIDDEN), torch.nn.Linear(HIDDEN, HIDDEN),
            torch.nn.GELU(), torch.nn.Linear(HIDDEN, VOCAB))
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.prof: Profiler = apply_policy(self, self.role, policy, topology)

    def _log_prob(self, tokens: Any) -> Any:
        logits = self.model(tokens[:, :-1])
        return self.torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None])[..., 0]


class Rollout(_Worker):
    role = "rollout"

    def generate_sequences(self, prompts: Any, length: int = 16) -> Any:
        with self.torch.no_grad():
            tokens = prompts
            for _ in range(length):
                logits = self.model(tokens)[:, -1]
                nxt = self.torch.multinomial(self.torch.softmax(logits, -1), 1)
                tokens = self.torch.cat([tokens, nxt], dim=1)
        return tokens


class Actor(_Worker):
    role = "actor"
    #: Seconds of extra compute before each all-reduce of the gradients: the demo's slow
    #: rank, which the other ranks then wait for in the all-reduce.
    slow = 0.0

    def compute_log_prob(self, tokens: Any) -> Any:
        with self.torch.no_grad():
            return self._log_prob(tokens)

    def update_actor(self, tokens: Any, old: Any, ref: Any, adv: Any,
                     mini_batches: int = 4) -> float:
        loss_sum = 0.0
        for chunk in range(mini_batches):
            part = slice(chunk * len(tokens) // mini_batches,
                         (chunk + 1) * len(tokens) // mini_batches)
            logp = self._log_prob(tokens[part])
            ratio = (logp - old[part]).exp()
            loss = -(ratio * adv[part, None]).mean() + 0.01 * (logp - ref[part]).pow(2).mean()
            self.optim.zero_grad()
            loss.backward()
            self._all_reduce_grads()
            self.optim.step()
            loss_sum += float(loss.detach())
            self.prof.step()  # one inner step per mini-batch
        return loss_sum / mini_batches

    def _all_reduce_grads(self) -> None:
        """The gradients averaged over the job's ranks in one all-reduce (a bucket, as DDP
        sends them); nothing outside a job."""
        torch = self.torch
        if self.slow:
            # Work measured in time, not in operations: however loaded the machine is,
            # this rank reaches the all-reduce that much later than the others.
            until = time.perf_counter() + self.slow
            # Few large operations: a trace of this rank no longer than the others'.
            spare = torch.randn(256, 256) / 16
            while time.perf_counter() < until:
                spare = torch.tanh(spare @ spare)
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        bucket = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(bucket)
        bucket /= dist.get_world_size()
        offset = 0
        for g in grads:
            g.copy_(bucket[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


class Ref(_Worker):
    role = "ref"

    def compute_ref_log_prob(self, tokens: Any) -> Any:
        with self.torch.no_grad():
            return self._log_prob(tokens)


class Critic(_Worker):
    role = "critic"

    def compute_values(self, tokens: Any) -> Any:
        with self.torch.no_grad():
            return self.model(tokens).mean(dim=(1, 2))

    def update_critic(self, tokens: Any, returns: Any) -> float:
        loss = (self.model(tokens).mean(dim=(1, 2)) - returns).pow(2).mean()
        self.optim.zero_grad()
        loss.backward()
        self.optim.step()
        return float(loss.detach())


def run(policy: Policy, *, steps: int = 4, batch: int = 16,
        topology: Topology | None = None) -> Mapping[str, float]:
    """Train ``steps`` PPO steps under ``policy``; returns the last losses."""
    import torch

    topo = topology or Topology()
    rollout, actor = Rollout(policy, topo), Actor(policy, topo)
    ref, critic = Ref(policy, topo), Critic(policy, topo)
    profilers = [w.prof for w in (rollout, actor, ref, critic)]
    losses: dict[str, float] = {}
    for step in range(1, steps + 1):
        with contextlib.ExitStack() as stack:
            for prof in profilers:
                stack.enter_context(prof.training_step(step))
            prompts = torch.randint(0, VOCAB, (batch, 4))
            tokens = rollout.generate_sequences(prompts)
            old = actor.compute_log_prob(tokens)
            ref_logp = ref.compute_ref_log_prob(tokens)
            values = critic.compute_values(tokens)
            reward = (tokens[:, -1] % 2).float()
            adv = reward - values
            losses["critic"] = critic.update_critic(tokens, reward)
            losses["actor"] = actor.update_actor(tokens, old, ref_logp, adv)
    for prof in profilers:
        prof.close()
    return losses
