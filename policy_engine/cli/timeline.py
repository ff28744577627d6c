"""policy-engine timeline DIR [--step N]: each training step of an RL job end to end.

For every profiled training step, every role's phases (the regions its ranks marked:
verl's stages through the plugin, a policy's regions) on every rank, laid on one time
axis: each rank's clock brought to rank 0's by the offset it measured over the job's
channel (each rank's own clock where none was measured, and the output says so). Per
row (a role's ranks whose phases agree): its phases and its share of the step busy,
waiting (in no phase of its own, or in the collective a phase begins or ends with,
while another role runs a phase: attributed to that phase) and idle; who waits for whom;
the critical path (the chain of phases that bounds the step); roles with no capture in
the step. Works from the manifests' summaries alone. The JSON output is the ``timeline``
part of `policy-engine analyze --format json` (schemas/analysis.schema.json).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from policy_engine.analysis import step_timeline
from policy_engine.analysis.timeline import text
from policy_engine.cli._common import add_format_option, positive_int, whole_number
from policy_engine.cli.analyze import default_jobs
from policy_engine.errors import printable


def add_parser(sub: Any, name: str, help: str) -> None:
    parser = sub.add_parser(name, help=help, description=__doc__)
    parser.add_argument("dir", metavar="DIR",
                        help="a run's output folder (the policy's output_dir)")
    parser.add_argument("--step", type=whole_number, metavar="N",
                        help="only this training step")
    parser.add_argument("--own-clocks", action="store_true",
                        help="lay each rank on its own clock, the measured offsets not "
                             "applied (what a merge of the traces by their timestamps shows)")
    parser.add_argument("--jobs", type=positive_int, metavar="N", default=None,
                        help="worker processes reading traces that have no summary "
                             "(default: the cores)")
    add_format_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    timeline = step_timeline(args.dir, step=args.step, jobs=args.jobs or default_jobs(),
                             own_clocks=args.own_clocks)
    if args.format == "json":
        print(json.dumps(timeline, indent=1))
    else:
        # names come from the manifests: each line printable
        print("\n".join(printable(line) for line in text(timeline)))
    return 0
