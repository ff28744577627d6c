"""policy-engine init [PATH]: write a commented starter profile_policy.yaml, and beside it
the JSON Schema (profile_policy.schema.json) that its first line points editors at."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from policy_engine.cli.usage import UsageError
from policy_engine.language.schema.build import SCHEMA_NAME, schema_text

STARTER = """\
# yaml-language-server: $schema=./{schema}
# A profiling policy: which roles, ranks and steps of the job are profiled.
# Check it with `policy-engine validate {name}` and preview it per rank with
# `policy-engine explain {name} --role trainer --world 8`. Editors complete and check
# keys from {schema} beside this file (line 1); after upgrading policy-engine,
# `policy-engine schema > {schema}` refreshes it.
version: 1
prefix: my-experiment            # label at the start of every trace name
output_dir: profiles             # relative to this file's folder unless absolute

defaults:                        # merged under every role below
  enabled: false                 # roles are off unless they say otherwise
  backend: torch                 # torch | mstx (Ascend NPU) | nsight | [torch, memory]
  ranks: [0]                     # profile the least unless asked
  steps: [2, 3]                  # outer training steps (training_step(n)) to capture
  # No schedule: each captured step is recorded whole, however many prof.step() calls
  # it makes (none, one per optimizer step as the Lightning and Hugging Face callbacks
  # make, or one per mini-batch). A schedule counts prof.step() calls within a capture,
  # so it needs at least wait + warmup + active of them in each step, for example:
  # schedule: {{wait: 0, warmup: 1, active: 2, repeat: 1}}
  torch:
    activities: [cpu, cuda]      # cuda is dropped with a warning where there is no GPU
    record_shapes: false
    with_stack: false

roles:
  trainer:                       # PolicyCallback(role="trainer") (Lightning, Hugging Face)
    enabled: true                # or profile_session("{name}", role="trainer")
  actor:                         # apply_policy(worker, role="actor") in a worker class
    enabled: true
    ranks: [0, -1]               # first and last rank
    regions: [update_actor]      # methods wrapped as ranges inside the capture
"""


def add_parser(sub: Any, name: str, help: str) -> None:
    parser = sub.add_parser(name, help=help, description=__doc__)
    parser.add_argument("path", nargs="?", default="profile_policy.yaml", metavar="PATH",
                        help="the policy to write (default: profile_policy.yaml)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite an existing policy (and a schema file that differs)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    path: str = args.path
    if os.path.isdir(path):
        path = os.path.join(path, "profile_policy.yaml")
    if os.path.splitext(path)[1].lower() not in (".yaml", ".yml"):
        raise UsageError(f"{path}: init writes YAML; name the file .yaml or .yml")
    text = STARTER.format(name=os.path.basename(path), schema=SCHEMA_NAME)
    _write(path, text, args.force)
    print(f"wrote {path}")
    _write_schema(os.path.join(os.path.dirname(path), SCHEMA_NAME), args.force)
    return 0


def _write(path: str, text: str, force: bool) -> None:
    try:
        with open(path, "w" if force else "x", encoding="utf-8") as f:
            f.write(text)
    except FileExistsError:
        raise UsageError(f"{path} exists; use --force to overwrite it") from None
    except OSError as err:
        raise UsageError(f"cannot write {path}: {err.strerror}") from None


def _write_schema(path: str, force: bool) -> None:
    """The schema beside the policy: editors resolve the relative ``$schema`` offline, and
    it travels with the policy. A different file there is kept unless ``force``."""
    text = schema_text()
    try:
        with open(path, encoding="utf-8") as f:
            old: str | None = f.read()
    except FileNotFoundError:
        old = None
    except (OSError, UnicodeDecodeError):
        old = ""  # unreadable: different
    if old == text:
        print(f"{path} is up to date")
        return
    if old is not None and not force:
        print(f"policy-engine init: warning: {path} exists and differs from this version's "
              f"schema; kept it (--force replaces it, as does `policy-engine schema > {path}`)",
              file=sys.stderr)
        return
    _write(path, text, force=True)
    print(f"{'replaced' if old is not None else 'wrote'} {path} (the JSON Schema editors "
          "read: the policy's first line points at it)")
