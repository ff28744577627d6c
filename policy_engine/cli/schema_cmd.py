"""policy-engine schema: print the policy file's JSON Schema."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from policy_engine.language.schema.build import schema_text


def add_parser(sub: Any, name: str, help: str) -> None:
    parser = sub.add_parser(name, help=help, description=__doc__)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(schema_text())
    return 0
