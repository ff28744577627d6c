"""policy-engine validate FILE...: every problem in every file."""

from __future__ import annotations

import argparse
import os
from typing import Any

import attrs

from policy_engine import settings as registry
from policy_engine.cli._common import (
    add_format_option,
    analyze_file,
    policy_parser,
    print_json,
)
from policy_engine.cli.forecast import Sizes, add_sizes_option, budget_problems, read_sizes
from policy_engine.cli.schema_link import schema_problems
from policy_engine.errors import PolicyError, Problem, json_path
from policy_engine.language.load import reading_order
from policy_engine.language.model import Policy
from policy_engine.language.read.document import Document, PolicyFileError
from policy_engine.language.rules.checks import UNNAMED, origin


def add_parser(sub: Any, name: str, help: str) -> None:
    parser = policy_parser(sub, name, help, __doc__, files=True)
    parser.add_argument("--strict", action="store_true", help="treat warnings as errors")
    parser.add_argument("--check-runtime", action="store_true",
                        help="also check that each enabled backend can run here")
    add_sizes_option(parser, "warn when a role's limits.bytes is below the size forecast")
    add_format_option(parser)
    parser.set_defaults(run=run)


def _check_file(path: str, args: argparse.Namespace,
                sizes: Sizes | None = None) -> tuple[int, list[Problem], Policy | None]:
    try:
        result = analyze_file(path, args)
    except PolicyFileError as err:
        return 2, list(err.problems), None
    except PolicyError as err:
        return 1, list(err.problems), None
    problems = [*result.problems, *schema_problems(result.document)]
    if args.check_runtime and result.policy is not None:
        problems += _runtime_problems(result.document, result.policy)
    if sizes is not None and result.policy is not None:
        doc = result.document
        for role, field, message in budget_problems(result.policy, sizes):
            at = origin(doc.data, role, field)
            problems.append(Problem(message, json_path(at), doc.locate(at), "warning"))
    if args.strict:
        problems = [attrs.evolve(p, severity="error") for p in problems]
    code = 1 if any(p.severity == "error" for p in problems) else 0
    return code, list(reading_order(problems)), result.policy


def _runtime_problems(doc: Document, policy: Policy) -> list[Problem]:
    """What stops the policy from running here: each enabled role's backend (package,
    device, toolkit) and the output folder. Found without importing torch."""
    data = doc.data
    problems: list[Problem] = []
    seen: set[tuple[str, str]] = set()
    for role in [*policy.roles, UNNAMED]:
        spec = policy.role(role)
        if not spec.enabled:
            continue
        at = origin(data, role, "backend")
        for name in spec.backends:
            for message in registry.check_runtime(name, spec.blocks[name]):
                if (name, message) not in seen:
                    seen.add((name, message))
                    problems.append(Problem(f"backend {name}: {message}",
                                            json_path(at), doc.locate(at)))
    folder = policy.output_dir
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    if not os.access(folder, os.W_OK):
        where = ("output_dir",) if "output_dir" in data else ()
        problems.append(Problem(f"output_dir {policy.output_dir} is not writable here",
                                json_path(where), doc.locate(where)))
    return problems


def _unchecked_ranks(policy: Policy | None, args: argparse.Namespace) -> str | None:
    """Which roles name ranks that nothing here could check: no --world, no --mesh, and no
    mesh in the policy for them (the world size is known only when the job runs)."""
    if policy is None or args.world is not None or args.mesh is not None:
        return None
    roles = [name for name in policy.roles
             if (spec := policy.role(name)).enabled and not spec.ranks.is_all
             and not policy.mesh_for(name)]
    if not roles:
        return None
    return (f"ranks of {', '.join(sorted(roles))} were not checked against a world size "
            "(none is known before the job starts): give --world N, or a mesh, to check them")


def run(args: argparse.Namespace) -> int:
    worst = 0
    report: list[dict[str, Any]] = []
    sizes = read_sizes(args.sizes_from) if args.sizes_from else None  # once, for every file
    for path in args.files:
        code, problems, policy = _check_file(path, args, sizes)
        worst = max(worst, code)
        hint = _unchecked_ranks(policy, args)
        report.append({"file": path, "valid": code == 0,
                       "problems": [p.to_json() for p in problems],
                       "notes": [hint] if hint else []})
        if args.format == "text":
            for problem in problems:
                print(problem.render())
            warnings = sum(p.severity == "warning" for p in problems)
            errors = len(problems) - warnings
            status = "valid" if code == 0 else "unreadable" if code == 2 else "invalid"
            detail = ", ".join(f"{n} {w}{'s' if n != 1 else ''}" for n, w in
                               ((errors, "error"), (warnings, "warning")) if n)
            if hint:
                print(f"{path}: note: {hint}")
            print(f"{path}: {status}" + (f" ({detail})" if detail else ""))
    if args.format == "json":
        print_json({"valid": worst == 0, "files": report})
    return worst
