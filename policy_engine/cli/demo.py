"""policy-engine demo: profile a small CPU PPO run under a policy and show the traces."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from policy_engine._resources import read_resource
from policy_engine.cli import traces
from policy_engine.language.load import load_policy
from policy_engine.language.read.source import parse_document

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
        policy = load_policy(data)
        label = f"built-in {DEFAULT_POLICY}"
    from policy_engine.cli import ppo as demo

    print(f"policy-engine demo: 4 workers (rollout, actor, ref, critic) in one process, "
          f"{args.steps} PPO steps on the CPU, policy: {label}")
    began = time.perf_counter()
    losses = demo.run(policy, steps=args.steps)
    print(f"trained in {time.perf_counter() - began:.1f} s "
          f"(actor loss {losses['actor']:.3f}, critic loss {losses['critic']:.3f})\n")
    traces.run(argparse.Namespace(dir=out, format="text"))
    print(f"""
Traces are under {out}. To look at one:
  - Perfetto: open https://ui.perfetto.dev and drag a .pt.trace.json.gz file onto it
    (chrome://tracing opens them too);
  - TensorBoard: pip install torch-tb-profiler, then tensorboard --logdir {out}
The manifest under {os.path.join(out, 'manifests')} lists each capture's role, rank,
steps and status; `policy-engine traces {args.out}` prints this table again.""")
    return 0
