"""The report's comparison section (``report --baseline BASE``): per pair of windows the
verdict (``inconclusive`` with why, and about how many steps a side would decide), the
test's figures, what differs in how the runs were recorded, the step time then and now with the
change split into its parts, and the regions and operators that moved most. Plain
markup: no script, nothing fetched; every value from the runs is escaped."""

from __future__ import annotations

from collections.abc import Sequence

from policy_engine.analysis.compare import PARTS, compare_runs
from policy_engine.analysis.compare_text import signed
from policy_engine.analysis.comparison import GateTest, Moved, WindowComparison
from policy_engine.analysis.errors import AnalysisError
from policy_engine.analysis.report_analysis import _esc
from policy_engine.analysis.text import ms

MAX_WINDOWS, ROWS = 60, 5
_STYLE = ("<style>.comparison .slower{color:#8b0000;font-weight:bold}"
          ".comparison .faster{color:#006400;font-weight:bold}"
          ".comparison .inconclusive{color:#8a5a00;font-weight:bold}"
          ".comparison td,.comparison th{padding:1px 8px}</style>")


def _rows(rows: Sequence[Moved], what: str) -> str:
    moved = [r for r in rows[:ROWS] if r.change_us]
    if not moved:
        return ""
    body = "".join(f"<tr><td>{_esc(r.name[:120])}</td><td>{_esc(ms(r.base_us))}</td>"
                   f"<td>{_esc(ms(r.new_us))}</td><td>{_esc(signed(r.change_us))}</td>"
                   "</tr>" for r in moved)
    return (f"<table><tr><th>{what} (ms per step, over the whole capture: its first step "
            "included)</th><th>base</th><th>new</th>"
            f"<th>change</th></tr>{body}</table>")


def _figures(t: GateTest) -> str:
    """The test's figures in one line: the change, p, the steps used, what they could
    tell and, where they could not, the steps a side that would."""
    change = "-" if t.change is None else f"{t.change:+.1%}"
    p = "-" if t.p is None else f"{t.p:.2g}"
    out = [f"Median step {change}", f"p = {p} (alpha {t.alpha})",
           f"{t.base_steps} and {t.new_steps} steps"]
    if t.detectable is not None:
        out.append(f"least change these steps could call: {t.detectable:.1%}")
    if t.decide_steps is not None:
        out.append(f"about {t.decide_steps} steps a side would decide")
    return ", ".join(out) + "."


def window_html(w: WindowComparison) -> str:
    verdict = w.verdict or "no verdict"
    css = {"slower": "slower", "faster": "faster", "inconclusive": "inconclusive"}.get(
        verdict, "")
    out = [f"<h3>{_esc(w.base.title)}</h3>",
           f'<p>Verdict: <span class="{css}">{_esc(verdict)}</span> ({_esc(w.why)})</p>']
    if w.test is not None:
        out.append(f"<p>{_esc(_figures(w.test))}</p>")
    if w.differences:
        out.append("<ul>" + "".join(
            f"<li>{'differs' if d.blocks else 'note'}: {_esc(d.message)}</li>"
            for d in w.differences) + "</ul>")
    left = w.left_out
    if left:
        out.append("<ul>" + "".join(
            f"<li>left out: {_esc(x.run)} rank {_esc(x.rank)}: {_esc(x.why)}</li>"
            for x in left[:ROWS]) + (f"<li>left out: {len(left) - ROWS} more ranks</li>"
                                     if len(left) > ROWS else "") + "</ul>")
    t, parts = w.step_time, w.parts
    if t is not None and parts is not None:
        out.append(f"<p>Median step: {_esc(ms(t.base_median_us))} ms &rarr; "
                   f"{_esc(ms(t.new_median_us))} ms. Mean step "
                   f"{_esc(signed(t.change_us))} ms = " + ", ".join(
                       f"{word} {_esc(signed(parts[key]))}" for key, word in PARTS)
                   + ".</p>")
    out.append(_rows(w.regions, "region") + _rows(w.operators, "operator"))
    s = w.straggler
    if s.changed:
        out.append(f"<p>Straggler: {_esc('none' if s.base is None else s.base)} "
                   f"&rarr; {_esc('none' if s.new is None else s.new)}</p>")
    calls = w.collectives
    if calls is not None:
        said = "; ".join(
            f"{word} {_esc(ms(c.base))} &rarr; {_esc(ms(c.new))} ms"
            + (f" ({_esc(signed(c.change))})" if c.change is not None else "")
            for c, word in ((calls.wait_us, "wait for the last arrival"),
                            (calls.transfer_us, "transfer")))
        out.append(f"<p>Collectives, per step (mean over ranks): {said}.</p>")
    return '<div class="window">' + "".join(out) + "</div>"


def section(baseline: str, root: str, *, jobs: int = 1) -> str:
    """The comparison of the run under ``root`` with the one under ``baseline``."""
    try:
        result = compare_runs(baseline, root, jobs=jobs)
    except AnalysisError as err:
        return (f'<section class="comparison"><h2>Against the baseline</h2><p class="note">'
                f"{_esc(err)}</p></section>")
    windows = result.windows
    verdicts: list[str] = [w.verdict or "no verdict" for w in windows]
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in sorted(set(verdicts)))
    more = (f'<p class="note">{len(windows) - MAX_WINDOWS} more windows are not drawn '
            "(policy-engine compare lists every one).</p>") if len(windows) > MAX_WINDOWS \
        else ""
    return (f'<section class="comparison">{_STYLE}<h2>Against the baseline</h2>'
            f"<p>Baseline: {_esc(result.base)}. {len(windows)} window(s) compared: "
            f"{_esc(counts)}.</p>"
            + "".join(window_html(w) for w in windows[:MAX_WINDOWS]) + more + "</section>")
