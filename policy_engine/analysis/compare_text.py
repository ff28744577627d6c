"""A comparison of two runs as text for a terminal: one block per pair of windows.

Every line is made printable as it is written: names, paths and messages come from the
runs' manifests and traces, and no escape sequence of theirs reaches the terminal.
"""

from __future__ import annotations

from typing import Any

from policy_engine.analysis.compare import PARTS
from policy_engine.analysis.comparison import RunComparison, WindowComparison
from policy_engine.analysis.text import ms
from policy_engine.errors import printable

#: Ranks left out of a comparison listed per window; the rest are counted.
LEFT_OUT = 5
#: Regions and operators listed per window, and the characters of a name shown.
ROWS, NAME = 5, 80


def signed(us: float | None) -> str:
    """A change in milliseconds with its sign (``-`` for none)."""
    if us is None:
        return "-"
    return ("+" if us >= 0 else "-") + ms(abs(us))


def _share(base: float | None, change: float) -> str:
    return f" ({change / base:+.1%})" if base else ""


def _window(w: WindowComparison) -> list[str]:
    head = w.base.title if w.base.title == w.new.title \
        else f"{w.base.title}  vs  {w.new.title}"
    lines = [head]
    for d in w.differences:
        lines.append(f"  {'differs' if d.blocks else 'note'}: {d.message}")
    left = w.left_out
    for x in left[:LEFT_OUT]:
        lines.append(f"  left out: {x.run} rank {x.rank}: {x.why}")
    if len(left) > LEFT_OUT:
        lines.append(f"  left out: {len(left) - LEFT_OUT} more ranks (--format json lists "
                     "them)")
    lines.append(f"  verdict: {w.verdict or 'none'} - {w.why}")
    t = w.step_time
    if t is not None and w.parts is not None:
        change = t.new_median_us - t.base_median_us
        lines.append(f"  step time (median, ms): {ms(t.base_median_us)} -> "
                     f"{ms(t.new_median_us)}, {signed(change)}"
                     f"{_share(t.base_median_us, change)}")
        parts = w.parts
        lines.append(f"  mean step {signed(t.change_us)} ms = " + ", ".join(
            f"{word} {signed(parts[key])}" for key, word in PARTS))
    for title, moved in (("regions", w.regions), ("operators", w.operators)):
        rows = [r for r in moved[:ROWS] if r.change_us]
        if rows:
            lines.append(f"  {title} that moved most (ms per step, over the whole capture: "
                         "its first step included):")
            lines += [f"    {printable(r.name, NAME)}: {ms(r.base_us)} -> "
                      f"{ms(r.new_us)} ({signed(r.change_us)})" for r in rows]
    s = w.straggler
    if s.changed:
        lines.append(f"  straggler: {_rank(s.base)} -> {_rank(s.new)}")
    elif s.base is not None:
        lines.append(f"  straggler: rank {s.base} in both")
    calls = w.collectives
    if calls is not None:
        said = []
        for c, word in ((calls.wait_us, "wait for the last arrival"),
                        (calls.transfer_us, "transfer")):
            said.append(f"{word} {ms(c.base)} -> {ms(c.new)}"
                        + (f" ({signed(c.change)})" if c.change is not None else ""))
        lines.append(f"  collectives (ms per step, mean over ranks): {'; '.join(said)}")
        late = calls.late_rank
        if late.changed:
            lines.append(f"  late rank at collectives: {_rank(late.base)} -> "
                         f"{_rank(late.new)}")
    return lines


def _rank(rank: Any) -> str:
    return "none" if rank is None else f"rank {rank}"


def render(result: RunComparison) -> str:
    """The whole comparison as text, each line printable."""
    lines = [f"base: {result.base}", f"new:  {result.new}", ""]
    for w in result.windows:
        lines += [*_window(w), ""]
    for side in ("base", "new"):
        left = result.unmatched[side]
        if left:
            lines.append(f"only in {side}: {', '.join(left)}")
    return "\n".join(map(printable, lines)).rstrip()
