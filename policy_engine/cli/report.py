"""policy-engine report DIR [-o OUT.html]: every capture of a run as one static HTML page.

The captures are those `policy-engine traces DIR` lists (captures that never closed
included). Per role, a grid of ranks by steps coloured by outcome (ranks with the same
outcome at every step share a row), then every capture with its size, plan hash and a
link to its file; captures that need attention come first, with their errors. For torch
traces (.pt.trace.json[.gz]) the operators with the most self time are listed; each file
is read as a stream, and --ops, --max-trace-mb and --max-total-mb bound the work and the
memory (a gzip that inflates past the limit is stopped, and the page says so). Files a
manifest names outside DIR are not read. The page fetches nothing and runs no script,
so it opens where the cluster is.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from policy_engine.analysis.compare_page import section as comparison
from policy_engine.analysis.ops import read_all_ops
from policy_engine.analysis.report_analysis import read_run, section
from policy_engine.analysis.report_page import captures, render
from policy_engine.analysis.stall_page import section as stall_section
from policy_engine.cli._common import check_output, whole_number, write_output
from policy_engine.cli.usage import UsageError


def add_parser(sub: Any, name: str, help: str) -> None:
    parser = sub.add_parser(name, help=help, description=__doc__)
    parser.add_argument("dir", metavar="DIR",
                        help="a run's output folder (the policy's output_dir)")
    parser.add_argument("-o", "--output", metavar="OUT", default="report.html",
                        help="the page to write (default: report.html)")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    parser.add_argument("--baseline", metavar="BASE",
                        help="also compare the run with the one under BASE "
                             "(what policy-engine compare BASE DIR says)")
    parser.add_argument("--top", type=whole_number, default=10, metavar="K",
                        help="operators listed per trace (default: 10)")
    parser.add_argument("--ops", type=whole_number, default=32, metavar="N",
                        help="torch traces to read operators from, those that need "
                             "attention first (default: 32; 0 reads none)")
    for flag, default, what in (
            ("--max-trace-mb", 128, "skip the operators and the figures of a trace longer "
                                    "than this"),
            ("--max-total-mb", 512, "read at most this much trace text for operators in "
                                    "all, and as much for the analysis section")):
        parser.add_argument(flag, type=whole_number, default=default, metavar="MB",
                            help=f"{what}, uncompressed (default: {default})")
    parser.set_defaults(run=run)


# -- the command --------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.dir):
        raise UsageError(f"{args.dir} is not a folder")
    out = args.output
    check_output(out, "the page", args.force)
    jobs = os.cpu_count() or 1
    # The manifests read once, a line at a time, for the analysis and the listing alike;
    # the analysis lets go of its index once its windows are made.
    index, listing = read_run(args.dir)
    extra = [section(args.dir, jobs=jobs, index=index,
                     limits=(args.max_trace_mb << 20, args.max_total_mb << 20))]
    del index
    data = listing.finish()
    entries = captures(data, args.dir, os.path.dirname(os.path.abspath(out)))
    ops, notes = read_all_ops(entries, args.dir, count=args.ops, top=args.top,
                              limit=args.max_trace_mb << 20, total=args.max_total_mb << 20)
    title = f"Captures under {os.path.abspath(args.dir)}"
    if args.baseline is not None:
        extra.insert(0, comparison(args.baseline, args.dir, jobs=jobs))
    page = render(data, entries, ops, title=title, notes=notes, extra=extra,
                  first=[stall_section(args.dir)])
    write_output(out, page.encode("utf-8"), args.force)
    bad = sum(1 for c in entries if c.troubled)
    print(out + (f" ({bad} capture(s) need attention)" if bad else ""))
    return 0
