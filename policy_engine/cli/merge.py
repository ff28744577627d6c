"""policy-engine merge DIR -o OUT: the per-rank torch traces of one capture window as one.

A capture window is what every rank of a role recorded for the same steps and schedule
cycle: one trace per rank, as the manifests under DIR list them. The merged trace has one
process per rank, named ``rank N (role, coords)`` and sorted by rank, with the clocks of
all ranks aligned on each trace's baseTimeNanoseconds, each rank's moved by the offset to
rank 0's clock it measured over the job's channel (--own-clocks: not moved). Traces are
read and written as streams, so memory stays small however large they are. Only torch
traces (.pt.trace.json[.gz]) are merged; the other files of the window are listed as
skipped.
OUT ending in .gz is gzipped. Every trace is read under the bounds the other readers
keep: --max-trace-mb of text and --max-events events per trace, and a gzip that inflates
to over 100 times its size is refused (its trailer is looked at first). A trace that
cannot be merged (not JSON, a number JSON cannot carry, past a bound, too many threads or
too large a top-level key) stops the merge with exit 1, naming the file and where; files
a manifest names outside DIR are not read, and OUT may never be a manifest or a file the
manifests name. OUT is published whole: interrupted (SIGTERM, Ctrl-C), merge leaves
nothing beside it.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from policy_engine.analysis.chrome_trace import TraceError
from policy_engine.analysis.merge import (
    choose,
    clock_said,
    describe,
    merge,
    records,
    refuse_inputs,
    say,
    skip_reason,
    span,
)
from policy_engine.analysis.merge_io import MAX_EVENTS, MAX_TRACE_MB, Bounds
from policy_engine.cli._common import check_output, whole_number
from policy_engine.cli.usage import UsageError
from policy_engine.errors import printable

_PROG = "policy-engine merge"
EXIT_BAD_DATA = 1  # a trace of the window cannot be read


def add_parser(sub: Any, name: str, help: str) -> None:
    parser = sub.add_parser(name, help=help, description=__doc__)
    parser.add_argument("dir", metavar="DIR",
                        help="a run's output folder (the policy's output_dir)")
    parser.add_argument("--role", metavar="R",
                        help="the role (needed when DIR holds traces of more than one)")
    parser.add_argument("--step", type=whole_number, metavar="N",
                        help="a step the window covers (needed when there is more than one)")
    parser.add_argument("--cycle", type=whole_number, metavar="K",
                        help="the schedule cycle, when the step has several")
    parser.add_argument("--region", metavar="NAME", help="the region, for discrete captures")
    parser.add_argument("--capture", type=whole_number, metavar="I",
                        help="the I-th capture (from 1) of the same steps and cycle, when a "
                             "region or a rerun captured them again")
    parser.add_argument("-o", "--output", required=True, metavar="OUT",
                        help="the merged trace (.pt.trace.json, or .gz to compress it)")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    parser.add_argument("--own-clocks", action="store_true",
                        help="leave each rank on its own clock (its measured offset to rank "
                             "0's not applied)")
    parser.add_argument("--max-trace-mb", type=whole_number, default=MAX_TRACE_MB,
                        metavar="MB", help="refuse a trace of more text than this, "
                        f"uncompressed (default: {MAX_TRACE_MB})")
    parser.add_argument("--max-events", type=whole_number, default=MAX_EVENTS, metavar="N",
                        help=f"refuse a trace of more events (default: {MAX_EVENTS:,})")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    root, out = args.dir, args.output
    if not os.path.isdir(root):
        raise UsageError(f"{root} is not a folder")
    check_output(out, "the merged trace", args.force)
    rows, inputs = records(root)
    window = choose(rows, root, role=args.role, step=args.step, cycle=args.cycle,
                    region=args.region, capture=args.capture)
    refuse_inputs(out, window, inputs)
    merged = []
    for r in sorted(window, key=lambda r: (not isinstance(r.get("rank"), int),
                                           r.get("rank") or 0)):
        why = skip_reason(r)
        if why is None:
            merged.append(r)
        else:
            shown = os.path.relpath(r["_file"], root) if r["_file"] else "(no file)"
            say(f"{_PROG}: skipped {shown} (rank {r.get('rank')}): {why}")
    what = printable(describe(window[0]["_key"], 2))  # the manifests' names
    if not merged:
        say(f"{_PROG}: error: no torch trace of {what} can be read")
        return EXIT_BAD_DATA
    try:
        events = merge(merged, root, out, args.force,
                       Bounds(args.max_trace_mb << 20, args.max_events), args.own_clocks)
    except TraceError as err:  # it names the trace's path, as the manifest gave it
        say(f"{_PROG}: error: {err}")
        return EXIT_BAD_DATA
    except FileExistsError:
        raise UsageError(f"{out} exists (--force replaces it)") from None
    except OSError as err:
        raise UsageError(f"{out}: cannot write: {err.strerror or err}") from None
    ranks = [r.get("rank") for r in merged]
    print(f"{out}: {what}, {'rank' if len(set(ranks)) == 1 else 'ranks'} {span(ranks)} "
          f"({_count(len(merged), 'trace')}, {_count(events, 'event')})")
    if args.own_clocks or any(r.get("_clock") is not None for r in merged):
        # (without any offset the traces align as they always did; the file's metadata
        # says so all the same)
        say(f"{_PROG}: note: clock: {clock_said(merged, args.own_clocks)}")
    return 0


def _count(n: int, noun: str) -> str:
    """``1 trace``, ``2 traces``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
