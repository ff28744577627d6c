"""policy-engine demo: profile a small CPU PPO run under a policy and show the traces."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from typing import Any

import attrs

from policy_engine._resources import read_resource
from policy_engine.cli import traces
from policy_engine.language.load import load_policy
from policy_engine.language.model import Policy
from policy_engine.language.read.source import parse_document
from policy_engine.plan.compile import compile_plan
from policy_engine.plan.topology import Topology

DEFAULT_POLICY = "verl_ppo.yaml"


def add_parser(sub: Any, name: str, help: str) -> None:
    parser = sub.add_parser(name, help=help, description=__doc__)
    parser.add_argument("--policy", metavar="FILE",
                        help=f"policy to run (default: the built-in {DEFAULT_POLICY})")
    parser.add_argument("--out", default="policy-engine-demo", metavar="DIR",
                        help="output folder (default: ./policy-engine-demo)")
    parser.add_argument("--steps", type=int, default=4, help="training steps (default 4)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    out = os.path.abspath(args.out)
    override = [f"output_dir={out}"]
    if args.policy:
        policy = load_policy(args.policy, overrides=override)
        label = args.policy
    else:
        text = read_resource(f"_policies/{DEFAULT_POLICY}", f"policies/{DEFAULT_POLICY}")
        data = parse_document(text, f"<built-in {DEFAULT_POLICY}>", "yaml").data
        data["output_dir"] = out
        label = f"built-in {DEFAULT_POLICY}"
        # A mapping has no file: the manifests and the report name the example instead.
        policy = attrs.evolve(load_policy(data), source=label)
    from policy_engine.cli import ppo as demo

    print(f"policy-engine demo: 4 workers (rollout, actor, ref, critic) in one process, "
          f"{args.steps} PPO steps on the CPU, policy: {label}")
    for line in past_the_world(policy, demo.ROLES):
        print(f"policy-engine demo: note: {line}")
    began = time.perf_counter()
    losses = demo.run(policy, steps=args.steps)
    print(f"trained in {time.perf_counter() - began:.1f} s "
          f"(actor loss {losses['actor']:.3f}, critic loss {losses['critic']:.3f})\n")
    traces.run(argparse.Namespace(dir=out, format="text"))
    print(f"""
Traces are under {out}. To look at one:
  - Perfetto: open https://ui.perfetto.dev and drag a .pt.trace.json.gz file onto it
    (it runs in the browser; the trace is not uploaded);
  - `policy-engine analyze {args.out}`: each step's time, compute and idle, rank by rank.
The manifest under {os.path.join(out, 'manifests')} lists each capture's role, rank,
steps and status; `policy-engine traces {args.out}` prints this table again.""")
    return 0


def past_the_world(policy: Policy, roles: Sequence[str]) -> list[str]:
    """What the demo's one process (rank 0 of a world of 1) leaves out of the policy: the
    ranks each of its enabled ``roles`` selects past rank 0."""
    out = []
    for role in roles:
        spec = policy.role(role)
        if not spec.enabled or not spec.ranks.check(1, None):
            continue
        kept = compile_plan(policy, role, Topology()).enabled
        out.append(f"role {role} selects ranks {spec.ranks}, but the demo runs one process, "
                   f"rank 0 of 1: ranks past 0 are not profiled"
                   + ("" if kept else f" (role {role} profiles nothing here)"))
    return out
