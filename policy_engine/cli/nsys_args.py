"""policy-engine nsys-args FILE --role R: how to launch a role's processes under nsys.

Prints the `nsys profile` arguments for every rank of the role that profiles with the
nsight backend: a POSIX sh wrapper (shell), everything as data (json), or Ray's
runtime_env["nsight"] dictionaries (ray). Ranks that do not profile get no nsys at all.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

from policy_engine.analysis.format import complement_spans, rank_spans
from policy_engine.backends.nsight.launch import (
    NsysArgsError,
    nsys_output,
    nsys_profile_args,
    report_path,
)
from policy_engine.cli._common import (
    add_format_option,
    load_role_layout,
    policy_parser,
    positive_int,
    print_json,
)
from policy_engine.cli.usage import UsageError
from policy_engine.errors import PolicyError, Problem, json_path
from policy_engine.language.model import Policy
from policy_engine.language.values.frozen import thaw
from policy_engine.plan.captures import count_ranges
from policy_engine.plan.compile import compile_plan
from policy_engine.plan.placement import places
from policy_engine.plan.topology import Topology

#: Report paths listed per rank; the rest follow the same numbering.
MAX_LISTED_REPORTS = 1000


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return int(text)


def add_parser(sub: Any, name: str, help: str) -> None:
    parser = policy_parser(sub, name, help, __doc__, role={"required": True})
    parser.add_argument(
        "--local-world",
        type=positive_int,
        metavar="N",
        help="processes per node (for <node>/<local_rank>)",
    )
    parser.add_argument(
        "--rank",
        type=_count,
        metavar="R",
        help="only rank R (ray: its dict, or null when it does not profile)",
    )
    parser.add_argument(
        "--plain-loop",
        action="store_true",
        help="the code never calls training_step(): one capture per process",
    )
    parser.add_argument(
        "--inner-steps",
        type=_count,
        metavar="N",
        help="prof.step() calls in each capture (counts schedule cycles)",
    )
    parser.add_argument(
        "--region-calls",
        type=_count,
        metavar="N",
        help="discrete mode: calls of each region per profiled step",
    )
    add_format_option(parser, "shell", "json", "ray")
    parser.set_defaults(run=run, format="shell")


def _profiled(policy: Policy, role: str, world: int, local_world: int | None) -> Iterator[Topology]:
    """The ranks whose plan is on, placed as the runtime places them."""
    return (place.topology for place in places(policy, role, world, local_world)
            if place.topology is not None)


def build(policy: Policy, role: str, world: int, args: argparse.Namespace) -> dict[str, Any]:
    """Everything the formats print, as data."""
    spec = policy.role(role)
    if spec.backend != "nsight":
        raise UsageError(f"role {role!r} profiles with {spec.backend}, not nsight")
    profiled = list(_profiled(policy, role, world, args.local_world))
    plans = [
        compile_plan(policy, role, topo)
        for topo in profiled
        if args.rank is None or topo.rank == args.rank
    ]
    settings = thaw(spec.settings)
    out: dict[str, Any] = {
        "role": role,
        "world": world,
        "policy": policy.source,
        "capture": settings["capture"],
        "profiled_ranks": rank_spans((t.rank for t in profiled), empty="none"),
        "unprofiled_ranks": complement_spans((t.rank for t in profiled), world),
        "ranks": {},
    }
    if not plans:
        out.update(ranges_per_process=0, notes=["no rank profiles: launch without nsys"])
        return out
    count = count_ranges(
        plans[0],
        inner_steps=args.inner_steps,
        region_calls=args.region_calls,
        plain_loop=args.plain_loop,
    )
    out.update(ranges_per_process=count.total, ranges_why=count.why)
    try:
        for plan in plans:
            launch = nsys_profile_args(
                capture=out["capture"],
                ranges=count.total,
                options=settings["options"],
                capture_range_end_setting=settings["capture_range_end"],
                output=nsys_output(plan.template, plan.output_dir),
            )
            output = launch.ray["o"]
            reports = (
                None
                if count.total is None
                else [
                    report_path(
                        output,
                        i,
                        numbered=count.total > 1
                        and not launch.capture_range_end.startswith("stop"),
                    )
                    for i in range(min(count.total, MAX_LISTED_REPORTS))
                ]
            )
            out["ranks"][str(plan.rank)] = {
                "args": list(launch.args),
                "output": output,
                "reports": reports,
                "ray": dict(launch.ray),
            }
    except NsysArgsError as err:
        raise PolicyError(
            [Problem(f"{err} ({count.why})", json_path(("roles", role, "nsight")))]
        ) from None
    out.update(capture_range_end=launch.capture_range_end, notes=list(launch.notes))
    generic = {nsys_output(p.template, p.output_dir, generic_rank=True) for p in plans}
    if len(plans) > 1 and len(generic) == 1:
        first = out["ranks"][str(plans[0].rank)]
        out["generic"] = {"args": [*first["args"][:-1], generic.pop()]}
    return out


def run(args: argparse.Namespace) -> int:
    policy, world = load_role_layout(args, "nsys-args")
    if args.rank is not None and args.rank >= world:
        raise UsageError(f"--rank {args.rank} is outside a world of {world}")
    data = build(policy, args.role, world, args)
    if args.format == "json":
        print_json(data)
    elif args.format == "ray":
        _print_ray(data, args.rank)
    else:
        sys.stdout.write(shell_script(data, args.file))
    return 0


def _print_ray(data: dict[str, Any], rank: int | None) -> None:
    ranks = data["ranks"]
    print(
        f"# ranks {data['unprofiled_ranks']} do not profile: give their workers no "
        "'nsight' key in runtime_env",
        file=sys.stderr,
    )
    if rank is not None:
        entry = ranks.get(str(rank))
        print(json.dumps(entry["ray"] if entry else None, indent=2))
    else:
        print_json({r: entry["ray"] for r, entry in ranks.items()})


def _command(args: list[str]) -> list[str]:
    """``set -- nsys profile ARGS SHIM "$@"``, one argument a line (``-o PATH`` on one)."""
    words = [shlex.quote(a) for a in args]
    for i in range(len(words) - 1, 0, -1):
        if words[i - 1] in ("-o", "-t"):
            words[i - 1 : i + 1] = [f"{words[i - 1]} {words[i]}"]
    # The shim writes the program's pid and execs it (same pid: nsys's %p stays right).
    return [
        '    set -- "${NSYS:-nsys}" profile \\',
        *(f"      {w} \\" for w in words),
        """      sh -c 'echo $$ > "$0"; exec "$@"' "$pidfile" "$@" ;;""",
    ]


_WAIT = [
    '"$@"',
    "rc=$?",
    "# With --kill=none nsys returns when it shuts its session down after the last capture",
    "# range, while the program goes on in a session of its own. Wait for it, so that the",
    "# launcher sees this rank end when the program does (its exit status is then nsys's).",
    'pid=$(cat "$pidfile" 2>/dev/null)',
    'rm -f "$pidfile"',
    'while [ -n "$pid" ] && s=$(ps -o stat= -p "$pid" 2>/dev/null) && [ "${s#Z}" = "$s" ]; do',
    "  sleep 1",
    "done",
    'exit "$rc"',
]


def shell_script(data: dict[str, Any], source: str) -> str:
    """A POSIX sh wrapper: ``wrapper.sh python train.py`` runs under nsys where it should."""
    ranks = data["ranks"]
    total = data.get("ranges_per_process")
    lines = [
        "#!/bin/sh",
        f"# nsys launch wrapper for role {data['role']} of {source} (world {data['world']}),",
        "# written by `policy-engine nsys-args`. Put it in front of each process of the role:",
        "#   torchrun --nproc-per-node=N --no-python ./nsys-wrap.sh python train.py ...",
        f"# It reads RANK. Ranks {data['unprofiled_ranks']} do not profile and run the "
        "command without nsys.",
    ]
    if ranks:
        opens = total if total is not None else "an unknown number of"
        text = [
            f"Each profiled process opens {opens} capture ranges: {data['ranges_why']}.",
            *(f"{note[0].upper()}{note[1:]}." for note in data["notes"]),
            "Report N (1-based) is capture_range N-1 in the manifest under the output folder.",
        ]
        lines += [f"# {line}" for para in text for line in textwrap.wrap(para, 86)]
    lines += ["pidfile=$(mktemp) || exit 1", 'case "${RANK:?RANK is not set}" in']
    generic = data.get("generic")
    branches = (
        [("|".join(ranks), generic["args"])]
        if generic
        else [(r, entry["args"]) for r, entry in ranks.items()]
    )
    for pattern, args in branches:
        lines.append(f"  {pattern})")
        folder = os.path.dirname(args[-1])
        # nsys does not create the folder (it falls back to /tmp); the engine also makes
        # it before the first capture, which covers folders named with nsys's % tokens.
        if folder and "%" not in folder:
            lines.append(f"    mkdir -p {shlex.quote(folder)}")
        lines += _command(args)
    lines += ["  *)", '    rm -f "$pidfile"', '    exec "$@" ;;', "esac", *_WAIT, ""]
    return "\n".join(lines)
