"""``python -m policy_engine.analysis.summarize_main PATH [--parent PID]``: the summary of
one torch trace (:func:`~policy_engine.analysis.summary.summarize`) as one JSON line on
stdout.

The runtime runs it in a process of its own after each torch capture
(``runtime.process.summaries``), so that the pure-Python work of reading a trace never holds the
training process's GIL. It imports no torch. It exits 0 whenever it prints a line, for a
trace it cannot read too (the line is ``{"error": ...}``, saying why); 2 for a usage
error. ``--parent PID``: stop when process PID is no longer this one's parent (it was
killed before it could stop this worker).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

USAGE = "usage: python -m policy_engine.analysis.summarize_main PATH [--parent PID]"
#: How often the parent is looked for, in seconds.
PARENT_POLL = 1.0


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL)
    os._exit(3)  # orphaned: nobody reads the summary


def _line(summary: Any) -> str:
    try:
        return json.dumps(summary, allow_nan=False)
    except (TypeError, ValueError) as err:
        return json.dumps({"error": f"the summary is not JSON: {err}"})


def _args(argv: list[str]) -> tuple[str, int | None] | None:
    """(path, parent pid) from the arguments; None when they are not that."""
    if len(argv) == 1:
        return argv[0], None
    if len(argv) == 3 and argv[1] == "--parent" and argv[2].isdigit():
        return argv[0], int(argv[2])
    return None


def main(argv: list[str] | None = None) -> int:
    parsed = _args(sys.argv[1:] if argv is None else argv)
    if parsed is None:
        print(USAGE, file=sys.stderr)
        return 2
    path, parent = parsed
    if parent is not None:
        threading.Thread(target=_watch, args=(parent,), daemon=True).start()
    from policy_engine.analysis.summary import summarize

    try:
        summary: Any = summarize(path)
    except MemoryError:
        summary = {"error": "out of memory while reading it"}
    except Exception as err:  # a trace no rule expected: said, not raised
        summary = {"error": f"{type(err).__name__}: {err}"}
    sys.stdout.write(_line(summary) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
