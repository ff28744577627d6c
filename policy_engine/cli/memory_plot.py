"""policy-engine memory-plot SNAPSHOT: draw a memory snapshot as one HTML page.

SNAPSHOT is a pickle from torch.cuda.memory._dump_snapshot (or the memory backend). It is
read without running any code it holds, and drawn without torch: allocated and reserved
bytes over time, the peak, any out-of-memory errors, and the largest allocations live at
the peak with their stacks. The page fetches nothing, so it opens where the cluster is.
An existing OUT is replaced only with --force.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from policy_engine.backends.memory.plot import SnapshotError, write_plot
from policy_engine.cli._common import check_output, whole_number
from policy_engine.cli.usage import UsageError

_PROG = "policy-engine memory-plot"


def add_parser(sub: Any, name: str, help: str) -> None:
    parser = sub.add_parser(name, help=help, description=__doc__)
    parser.add_argument("snapshot", metavar="SNAPSHOT",
                        help="a memory snapshot (.pickle) the memory backend wrote")
    parser.add_argument("-o", "--output", metavar="OUT",
                        help="the page to write (default: SNAPSHOT with .pickle as .html)")
    parser.add_argument("--device", type=whole_number, metavar="N",
                        help="the device to plot (default: the one with the most entries)")
    parser.add_argument("--top", type=whole_number, default=10, metavar="K",
                        help="how many of the largest allocations to list (default: 10)")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    parser.set_defaults(run=run)


def default_output(snapshot: str) -> str:
    """``x.pickle`` -> ``x.html``; any other name gets ``.html`` added."""
    return (snapshot.removesuffix(".pickle") if snapshot.endswith(".pickle") else snapshot) \
        + ".html"


def run(args: argparse.Namespace) -> int:
    out = args.output or default_output(args.snapshot)
    check_output(out, "the page", args.force)  # before the work of reading the snapshot
    try:
        write_plot(args.snapshot, out, device=args.device, top=args.top, force=args.force)
    except SnapshotError as err:
        print(f"{_PROG}: {err}", file=sys.stderr)
        return 2
    except FileExistsError:
        raise UsageError(f"{out} exists (--force replaces it)") from None
    except OSError as err:
        print(f"{_PROG}: {out}: cannot write: {err.strerror or err}", file=sys.stderr)
        return 2
    print(out)
    return 0
