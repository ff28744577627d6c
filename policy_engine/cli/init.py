"""policy-engine init [PATH]: write a commented starter profile_policy.yaml."""

from __future__ import annotations

import argparse
import os
from typing import Any

from policy_engine.cli.usage import UsageError

STARTER = """\
# yaml-language-server: $schema=https://policy-engine.dev/schemas/profile_policy.schema.json
# A profiling policy: which roles, ranks and steps of the job are profiled.
# Check it with `policy-engine validate {name}` and preview it per rank with
# `policy-engine explain {name} --role actor --world 8`.
version: 1
prefix: my-experiment            # label at the start of every trace name
output_dir: profiles             # relative to this file's folder unless absolute

defaults:                        # merged under every role below
  enabled: false                 # roles are off unless they say otherwise
  backend: torch                 # torch | mstx (Ascend NPU) | nsight
  ranks: [0]                     # profile the least unless asked
  steps: [2, 3]                  # outer training steps (training_step(n)) to capture
  schedule:                      # inner steps (prof.step()) within each capture
    wait: 0
    warmup: 1
    active: 2
    repeat: 1
  torch:
    activities: [cpu, cuda]      # cuda is dropped with a warning where there is no GPU
    record_shapes: false
    with_stack: false

roles:
  actor:
    enabled: true
    ranks: [0, -1]               # first and last rank
    regions: [update_actor]      # methods wrapped as ranges inside the capture
"""


def add_parser(sub: Any, name: str, help: str) -> None:
    parser = sub.add_parser(name, help=help, description=__doc__)
    parser.add_argument("path", nargs="?", default="profile_policy.yaml", metavar="PATH")
    parser.add_argument("--force", action="store_true", help="overwrite an existing file")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    path: str = args.path
    if os.path.isdir(path):
        path = os.path.join(path, "profile_policy.yaml")
    if os.path.splitext(path)[1].lower() not in (".yaml", ".yml"):
        raise UsageError(f"{path}: init writes YAML; name the file .yaml or .yml")
    text = STARTER.format(name=os.path.basename(path))
    try:
        with open(path, "w" if args.force else "x", encoding="utf-8") as f:
            f.write(text)
    except FileExistsError:
        raise UsageError(f"{path} exists; use --force to overwrite it") from None
    except OSError as err:
        raise UsageError(f"cannot write {path}: {err.strerror}") from None
    print(f"wrote {path}")
    return 0
