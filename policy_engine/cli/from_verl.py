"""policy-engine from-verl CONFIG: write the policy equivalent to a verl run's profiler
settings (Hydra's saved .hydra/config.yaml, or any composed verl trainer YAML; one still to
compose, with a top-level defaults: list, is composed by Hydra first), with verl's
command-line overrides applied first. Each key of the policy says which verl key it comes
from; what a policy cannot express is listed at its top and printed here."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from policy_engine.cli._common import check_output, write_output
from policy_engine.cli.usage import UsageError
from policy_engine.errors import PolicyError
from policy_engine.integrations.verl_config import convert_file, policy_text
from policy_engine.language.load import analyze
from policy_engine.language.read.document import PolicyFileError
from policy_engine.language.read.source import parse_document


def add_parser(sub: Any, name: str, help: str) -> None:
    parser = sub.add_parser(name, help=help, description=__doc__)
    parser.add_argument(
        "config",
        metavar="CONFIG",
        help="a verl config: .hydra/config.yaml of a run, or a trainer YAML (composed by "
        "Hydra first when it has a defaults: list)",
    )
    parser.add_argument(
        "-o",
        "--output",
        default="profile_policy.yaml",
        metavar="FILE",
        help="the policy to write (default: profile_policy.yaml)",
    )
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a verl override as its command line gives it (a.b=1, +a.b=1, "
        "++a.b=1, ~a.b); repeatable, applied in order",
    )
    parser.add_argument("--force", action="store_true", help="replace FILE if it exists")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    out: str = args.output
    if os.path.splitext(out)[1].lower() not in (".yaml", ".yml"):
        raise UsageError(f"{out}: from-verl writes YAML; name the file .yaml or .yml")
    check_output(out, "the policy", args.force)
    try:
        conv = convert_file(args.config, args.sets)
    except PolicyFileError as err:
        raise UsageError(str(err.problems[0].message)) from None
    text = policy_text(conv, os.path.abspath(args.config))
    result = analyze(parse_document(text, out, "yaml"))
    if result.errors:  # the converter promises a valid policy: say what broke it
        raise PolicyError(result.errors)
    for text_line in conv.unmapped:
        print(f"policy-engine from-verl: no equivalent: {text_line}", file=sys.stderr)
    for warning in result.warnings:
        print(warning.render(), file=sys.stderr)
    write_output(out, text.encode("utf-8"), args.force)
    print(f"wrote {out}")
    return 0
