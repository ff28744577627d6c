"""policy-engine analyze DIR: per capture window and rank, where each step's time goes, which
rank the others wait for, and what the window lacks for which analysis.

For every window (role, step or cycle, region) the manifests under DIR list: step time
per ProfilerStep and per region range (min/median/max across ranks); compute,
communication, their overlap and idle time (on the GPU when the traces hold kernels);
the straggler, with how much later than the median rank it arrives; readiness warnings.
Traces are read as streams in a process pool (--jobs). --hta puts Holistic Trace
Analysis's temporal breakdown and overlap beside ours where a window holds GPU kernels.
The JSON output's shape is schemas/analysis.schema.json.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from policy_engine.analysis import hta as hta_bridge
from policy_engine.analysis.run import analyze_run
from policy_engine.analysis.text import render
from policy_engine.cli._common import (
    add_format_option,
    positive_int,
    stdout_bytes,
    whole_number,
)


def add_parser(sub: Any, name: str, help: str) -> None:
    parser = sub.add_parser(name, help=help, description=__doc__)
    parser.add_argument("dir", metavar="DIR",
                        help="a run's output folder (the policy's output_dir)")
    parser.add_argument("--role", metavar="R", help="only the windows of this role")
    parser.add_argument("--step", type=whole_number, metavar="N",
                        help="only the windows that cover this outer step")
    parser.add_argument("--jobs", type=positive_int, metavar="N", default=None,
                        help="worker processes reading traces (default: the cores)")
    parser.add_argument("--from-traces", action="store_true",
                        help="read every trace, even where its rank summarised it in the "
                             "manifest")
    parser.add_argument("--hta", action="store_true",
                        help="also run Holistic Trace Analysis on windows with GPU kernels")
    add_format_option(parser)
    parser.set_defaults(run=run)


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def run(args: argparse.Namespace) -> int:
    result = analyze_run(args.dir, role=args.role, step=args.step,
                         jobs=args.jobs or default_jobs(), from_traces=args.from_traces)
    try:
        if args.hta:
            if hta_bridge.available():
                result = result.with_hta(args.dir)
            else:
                print(f"policy-engine analyze: warning: --hta: HTA is not installed "
                      f"({hta_bridge.INSTALL})", file=sys.stderr)
        if args.format == "json":  # a rank at a time: 100,000 ranks are never held
            out = stdout_bytes()
            result.write_json(out)
            if hasattr(out, "flush"):
                out.flush()
        else:
            print(render(result))
    finally:
        result.close()
    return 0
