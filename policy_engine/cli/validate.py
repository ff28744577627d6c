"""policy-engine validate FILE...: every problem in every file."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import PolicyError, Problem
from ..loader import PolicyFileError
from ._common import add_format_option, add_layout_options, analyze_file, print_json


def add_parser(sub: Any, name: str) -> None:
    parser = sub.add_parser(name, help="check policy files", description=__doc__)
    parser.add_argument("files", nargs="+", metavar="FILE")
    add_layout_options(parser)
    parser.add_argument("--strict", action="store_true", help="treat warnings as errors")
    parser.add_argument("--check-runtime", action="store_true",
                        help="also check that each enabled backend can run here")
    add_format_option(parser)
    parser.set_defaults(run=run)


def _check_file(path: str, args: argparse.Namespace) -> tuple[int, list[Problem]]:
    try:
        result = analyze_file(path, args)
    except PolicyFileError as err:
        return 2, list(err.problems)
    except PolicyError as err:
        return 1, list(err.problems)
    problems = list(result.problems)
    if args.check_runtime and not result.errors:
        from ..runtime_checks import check_runtime

        problems += check_runtime(result.document)
    if args.strict:
        problems = [p if p.severity == "error" else Problem(p.message, p.json_path, p.location)
                    for p in problems]
    return (1 if any(p.severity == "error" for p in problems) else 0), problems


def run(args: argparse.Namespace) -> int:
    worst = 0
    report: list[dict[str, Any]] = []
    for path in args.files:
        code, problems = _check_file(path, args)
        worst = max(worst, code)
        report.append({"file": path, "valid": code == 0,
                       "problems": [p.to_json() for p in problems]})
        if args.format == "text":
            for problem in problems:
                print(problem.render(), file=sys.stderr if code else sys.stdout)
            warnings = sum(p.severity == "warning" for p in problems)
            errors = len(problems) - warnings
            status = "valid" if code == 0 else "unreadable" if code == 2 else "invalid"
            detail = ", ".join(f"{n} {w}{'s' if n != 1 else ''}" for n, w in
                               ((errors, "error"), (warnings, "warning")) if n)
            print(f"{path}: {status}" + (f" ({detail})" if detail else ""))
    if args.format == "json":
        print_json({"valid": worst == 0, "files": report})
    return worst
