"""policy-engine compare BASE NEW: what a change did between two runs, window by window.

Windows are matched by role and region, then in order (the first window of each run, the
second, ...); --step N compares the windows covering step N in both, --step A:B step A of
BASE with step B of NEW. For each pair: what differs in how the runs were recorded (world
size, mesh, GPU or CPU basis and what the profiler recorded withhold a verdict; the
policy and the torch version are only said), the median step time then and now, the change of
the mean step split into compute, exposed communication, other device work and idle, the
regions and operators whose time per step moved most, the straggler then and now, and a
verdict: slower or faster only where a rank-sum test over the steps (each step once, the
median of its ranks) says the difference is beyond the steps' own noise (p < 0.005), the
median moved by 5% or more and lies outside the other run's middle half of steps, else no
change. Ranks' summaries are used where they wrote them (--from-traces reads the traces).
The JSON output's shape is schemas/compare.schema.json.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from policy_engine.analysis.compare import compare_runs
from policy_engine.analysis.compare_text import render
from policy_engine.cli._common import add_format_option, positive_int, print_json
from policy_engine.cli.analyze import default_jobs

_STEPS = re.compile(r"^(\d+)(?::(\d+))?$")


def _steps(text: str) -> tuple[int, int]:
    found = _STEPS.match(text)
    if found is None:
        raise argparse.ArgumentTypeError(f"expected N or A:B (steps), got {text!r}")
    a = int(found.group(1))
    return a, int(found.group(2)) if found.group(2) is not None else a


def add_parser(sub: Any, name: str, help: str) -> None:
    parser = sub.add_parser(name, help=help, description=__doc__)
    parser.add_argument("base", metavar="BASE", help="the run before the change")
    parser.add_argument("new", metavar="NEW", help="the run after it")
    parser.add_argument("--role", metavar="R", help="only the windows of this role")
    parser.add_argument("--step", type=_steps, metavar="N|A:B",
                        help="the windows covering step N in both runs, or step A of BASE "
                             "and step B of NEW")
    parser.add_argument("--jobs", type=positive_int, metavar="N", default=None,
                        help="worker processes reading traces (default: the cores)")
    parser.add_argument("--from-traces", action="store_true",
                        help="read every trace, even where its rank summarised it")
    add_format_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    result = compare_runs(args.base, args.new, role=args.role, steps=args.step,
                          jobs=args.jobs or default_jobs(), from_traces=args.from_traces)
    if args.format == "json":
        print_json(result.to_json())
    else:
        print(render(result))
    return 0
