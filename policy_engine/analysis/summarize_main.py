"""``python -m policy_engine.analysis.summarize_main PATH [--parent PID] [--trim-bytes N]
[--max-bytes N] [--memory-bytes N]``: the summary of one torch trace
(:func:`~policy_engine.analysis.summary.summarize`) as one JSON line on stdout.

The runtime runs it in a process of its own after each torch capture
(``runtime.process.summaries``), so that the pure-Python work of reading a trace never holds the
training process's GIL. It imports no torch. The line is ``{"summary": {...}}``, with
``"trimmed": "..."`` when bulky parts were left out to fit, or ``{"error": "..."}`` saying
why there is none; it exits 0 whenever it prints a line, for a trace it cannot read too,
and 2 for a usage error.

Its output and its memory are bounded, whatever the trace holds:

- a summary past ``--trim-bytes`` (:data:`MAX_SUMMARY_BYTES`) as JSON loses the regions
  beyond the top :data:`TRIM_REGIONS`, the operators beyond the top :data:`TRIM_OPS` and
  the facts' name lists; one still past ``--max-bytes`` (:data:`MAX_KEPT_BYTES`, what a
  manifest line may hold of it) keeps only the first steps that fit (``facts.steps_left_out``
  counts the others). The line printed is never longer than ``--max-bytes``.
- the worker's data segment is limited to ``--memory-bytes`` (:data:`MEMORY_BYTES`,
  ``RLIMIT_DATA``): a trace that needs more gives an ``out of memory`` error line, never a
  node that swaps. The worker watches its own size too, and stops at :data:`MARGIN` below
  the limit: an allocation that fails inside a C extension (orjson) may crash instead of
  raising MemoryError.

``--parent PID``: stop when process PID is no longer this one's parent (it was killed
before it could stop this worker).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, TypedDict

from policy_engine.analysis.collective_form import shrink

if TYPE_CHECKING:  # the runtime imports this module for its limits: not the reader
    from policy_engine.analysis.summary import RankSummary, StepRow

USAGE = ("usage: python -m policy_engine.analysis.summarize_main PATH [--parent PID] "
         "[--trim-bytes N] [--max-bytes N] [--memory-bytes N]")
#: How often the worker looks for its parent and at its own size, in seconds.
WATCH_POLL = 0.05
#: A summary (as JSON) past this loses its bulky parts; one past the second, its last
#: steps. The second is what a manifest line may hold of a summary.
MAX_SUMMARY_BYTES = 64 << 10
MAX_KEPT_BYTES = 512 << 10
TRIM_REGIONS = 4
TRIM_OPS = 8
#: The worker's data segment at most (RLIMIT_DATA): a 1 GB trace of 5.8 million events
#: needs about 310 MB, both views included (benchmarks/bench_summary_memory.py).
MEMORY_BYTES = 512 << 20
#: How far below its limit the worker stops itself (at most a quarter of the limit).
MARGIN = 64 << 20
_ENVELOPE = 1 << 10  # room for {"summary": ..., "trimmed": "..."} around the summary
_OPTIONS = ("--parent", "--trim-bytes", "--max-bytes", "--memory-bytes")


class WorkerLine(TypedDict, total=False):
    """The one line the worker prints (made by :func:`main`): ``summary`` (with
    ``trimmed`` saying what was left out of it), or ``error``."""

    summary: RankSummary
    trimmed: str
    error: str


def _watch(parent: int | None, most: int | None) -> None:
    """Stop the worker when its parent is gone, or (SIGUSR1: MemoryError in the main
    thread) when its data segment passes ``most`` bytes."""
    page = os.sysconf("SC_PAGE_SIZE")
    while True:
        if parent is not None and os.getppid() != parent:
            os._exit(3)  # orphaned: nobody reads the summary
        if most is not None and _data_bytes(page) > most:
            os.kill(os.getpid(), signal.SIGUSR1)
            return
        time.sleep(WATCH_POLL)


def _data_bytes(page: int) -> int:
    """This process's data segment (what RLIMIT_DATA counts); 0 where /proc does not say."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[5]) * page
    except (OSError, ValueError, IndexError):
        return 0


def _over(signum: int, frame: Any) -> None:
    raise MemoryError


def _size(value: Any) -> int:
    return len(json.dumps(value))


def fit(summary: RankSummary, trim_bytes: int = MAX_SUMMARY_BYTES,
        max_bytes: int = MAX_KEPT_BYTES) -> WorkerLine:
    """What the worker prints of ``summary``: whole, trimmed, or an error when even its
    bare figures are past ``max_bytes``."""
    size = _size(summary)
    if size <= trim_bytes:
        return {"summary": summary}
    calls = summary.get("collectives")
    if isinstance(calls, dict):  # calls listed one by one go first: the rest stays whole
        without = _size({k: v for k, v in summary.items() if k != "collectives"})
        listed = len((calls.get("calls") or {}).get("start") or ())
        if listed and without < trim_bytes:
            each = max(_size(calls) // listed, 1)
            keep = max((trim_bytes - without) // each - 1, 0)
            if keep < listed:
                summary = {**summary, "collectives": shrink(calls, keep)}
                if _size(summary) <= trim_bytes:
                    return {"summary": summary, "trimmed": (
                        f"the summary was {size} bytes, over {trim_bytes >> 10} KiB: "
                        f"collective calls past the first {keep} were folded")}
    trimmed = summary.copy()
    regions = summary.get("regions")
    if isinstance(regions, dict):  # the longest regions first (analysis.summary)
        trimmed["regions"] = dict(list(regions.items())[:TRIM_REGIONS])
    facts = summary.get("facts")
    if isinstance(facts, dict):
        trimmed["facts"] = facts = {**facts, "hta_unrecognised": [], "looks_like_comm": []}
    ops = summary.get("ops")
    if isinstance(ops, dict) and isinstance(ops.get("top"), list):  # the most time first
        top = ops["top"]
        trimmed["ops"] = {**ops, "top": top[:TRIM_OPS],
                          "left_out": int(ops.get("left_out") or 0) + len(top[TRIM_OPS:])}
    said = (f"the summary was {size} bytes, over {trim_bytes >> 10} KiB: regions beyond "
            f"the top {TRIM_REGIONS}, operators beyond the top {TRIM_OPS} and the facts' "
            "name lists were left out")
    room = max_bytes - _ENVELOPE
    steps = trimmed.get("steps")
    if _size(trimmed) > room and isinstance(steps, list) and isinstance(facts, dict):
        keep = _steps_that_fit(trimmed, steps, room)
        trimmed["steps"] = steps[:keep]
        left_out = len(steps) - keep + int(facts.get("steps_left_out") or 0)
        trimmed["facts"] = {**facts, "steps_left_out": left_out}
        said += f"; steps past the first {keep} were left out ({left_out} in all)"
    left = _size(trimmed)
    if left > room:
        return {"error": f"the summary is {left} bytes even trimmed, over the "
                         f"{max_bytes >> 10} KiB a manifest line may hold of it"}
    return {"summary": trimmed, "trimmed": said}


def _steps_that_fit(trimmed: RankSummary, steps: list[StepRow], room: int) -> int:
    """How many of the first steps fit in ``room`` with the rest of the summary."""
    left = room - _size({**trimmed, "steps": [], "facts": {**trimmed["facts"],
                                                           "steps_left_out": len(steps)}})
    keep = 0
    for row in steps:
        left -= _size(row) + 2  # and the ", " before the next
        if left < 0:
            break
        keep += 1
    return keep


def _line(found: WorkerLine, max_bytes: int) -> str:
    try:
        text = json.dumps(found, allow_nan=False)
    except (TypeError, ValueError) as err:
        return json.dumps({"error": f"the summary is not JSON: {err}"})
    if len(text) > max_bytes:  # only an error message or a trace's names could do it
        return json.dumps({"error": f"the summary line is {len(text)} bytes, over the "
                                    f"{max_bytes} a manifest line may hold of it"})
    return text


def _args(argv: list[str]) -> tuple[str, dict[str, int]] | None:
    """(path, options) from the arguments; None when they are not that."""
    if not argv or argv[0].startswith("--") or len(argv) % 2 == 0:
        return None
    options: dict[str, int] = {}
    for flag, value in zip(argv[1::2], argv[2::2], strict=True):
        if flag not in _OPTIONS or flag in options or not value.isdigit():
            return None
        options[flag] = int(value)
    return argv[0], options


def _limit_memory(most: int) -> None:
    """Hold this process's data segment (heap and private mappings) to ``most`` bytes."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        most = min(most, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (most, most))


def main(argv: list[str] | None = None) -> int:
    parsed = _args(sys.argv[1:] if argv is None else argv)
    if parsed is None:
        print(USAGE, file=sys.stderr)
        return 2
    path, options = parsed
    parent = options.get("--parent")
    memory = options.get("--memory-bytes", MEMORY_BYTES)
    max_bytes = options.get("--max-bytes", MAX_KEPT_BYTES)
    most = None
    if argv is None:  # a process of its own (a caller in-process keeps its own limits)
        _limit_memory(memory)
        signal.signal(signal.SIGUSR1, _over)
        most = memory - min(MARGIN, memory // 4)
    if parent is not None or most is not None:
        threading.Thread(target=_watch, args=(parent, most), daemon=True).start()
    from policy_engine.analysis.summary import summarize

    found: WorkerLine = {}
    try:
        summary = summarize(path)
        found = {"error": summary["error"]} if "error" in summary else \
            fit(summary, options.get("--trim-bytes", MAX_SUMMARY_BYTES), max_bytes)
    except MemoryError:
        pass  # said below, once what the summary held is let go
    except Exception as err:  # a trace no rule expected: said, not raised
        found = {"error": f"{type(err).__name__}: {err}"}
    if not found:
        found = {"error": f"out of memory: summarising it needs more than the "
                          f"{memory >> 20} MiB a summary worker may use"}
    sys.stdout.write(_line(found, max_bytes) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
