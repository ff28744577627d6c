"""policy-engine traces DIR: every capture the manifests under DIR record, as one table.

Also shows captures that opened and never closed (interrupted, or still running), and
flags files on disk that no manifest names, manifest entries whose file is gone, saves
that never finished, and manifest lines that could not be read.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any

from policy_engine.analysis.listing import (
    PATH_NOTES,
    cell,
    collect,
    row_cells,
    row_order,
    summary_line,
)
from policy_engine.cli._common import add_format_option, print_json
from policy_engine.cli.usage import UsageError


def add_parser(sub: Any, name: str, help: str) -> None:
    parser = sub.add_parser(name, help=help, description=__doc__)
    parser.add_argument("dir", metavar="DIR",
                        help="a run's output folder (the policy's output_dir)")
    add_format_option(parser)
    parser.set_defaults(run=run)


def _emit(line: str) -> None:
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    with contextlib.suppress(LookupError):
        line = line.encode(encoding, "backslashreplace").decode(encoding, "replace")
    print(line)


def run(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.dir):
        raise UsageError(f"{args.dir} is not a folder")
    data = collect(args.dir)
    if args.format == "json":
        print_json(data)
        return 0
    header = ("ROLE", "REGION", "RANK", "STEPS", "CYCLE", "STATUS", "SIZE", "PATH")
    rows = sorted([*data["traces"], *data["interrupted"]], key=row_order)
    table = [header] + [row_cells(r) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    for row in table:
        _emit("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1])
    _emit(summary_line(data))
    for key, word, why in PATH_NOTES:
        for path in data[key]:
            _emit(f"{word}: {cell(path)} ({why})")
    for bad in data["bad_lines"]:
        _emit(f"bad manifest line: {cell(bad['manifest'])}:{bad['line']}: {cell(bad['why'])}")
    for unreadable in data["unreadable"]:
        _emit(f"unreadable: {cell(unreadable['path'])}: {cell(unreadable['why'])}")
    return 0
