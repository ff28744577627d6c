"""The report's analysis section: per capture window, why it exists, an inline SVG of
per-rank stacked bars (compute, communication, other device work, idle) with the
straggler marked, step times, and what the window lacks for which analysis.

The SVG is plain markup (no script, nothing fetched). Page size stays bounded however
many ranks and windows a run has: ranks whose bars look alike (each part within
:data:`BUCKETS` of the longest bar) share one bar labelled with their ranks; at most
:data:`MAX_BARS` bars, :data:`MAX_STEPS` step rows and :data:`MAX_WINDOWS` windows are
drawn, and what is left out is counted.
"""

from __future__ import annotations

import html
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

from policy_engine.analysis.answers import WindowAnalysis
from policy_engine.analysis.errors import AnalysisError
from policy_engine.analysis.format import rank_spans
from policy_engine.analysis.listing import Listing
from policy_engine.analysis.manifests import read_lines
from policy_engine.analysis.report_calls import STYLE as CALLS_STYLE
from policy_engine.analysis.report_calls import section as calls_section
from policy_engine.analysis.report_gantt import section as timeline_section
from policy_engine.analysis.run import analyze_run
from policy_engine.analysis.text import ms, notes, why
from policy_engine.analysis.window import StepTimes
from policy_engine.analysis.windows import Index
from policy_engine.errors import printable

#: (key, label, colour) of a bar's parts, left to right.
PARTS = (("compute", "compute", "#4e79a7"), ("comm", "communication", "#f28e2b"),
         ("other", "other device work", "#76b7b2"), ("idle", "idle", "#cfcfcf"))
MAX_BARS, MAX_STEPS, MAX_WINDOWS = 32, 40, 60
#: Traces the report reads for its analysis: one window of 4,096 ranks.
MAX_TRACES = 4096
BUCKETS = 20  # a part rounds to 1/20 of the longest bar when ranks are grouped
_LABEL_W, _BAR_W, _ROW_H = 170, 440, 18


def _esc(value: Any) -> str:
    """Printable (control characters escaped: manifests are untrusted) and HTML-escaped."""
    return html.escape(printable(str(value)), quote=True)


def _parts(total: dict[str, float]) -> dict[str, float]:
    """A rank's totals as the bar's parts: communication not hidden under compute."""
    return {"compute": total["compute_us"], "comm": total["comm_us"] - total["overlap_us"],
            "other": total["other_us"], "idle": total["idle_us"]}


def _bars(ranks: Iterable[Any], straggler: Any) -> list[tuple[list[Any], dict[str, float]]]:
    """(ranks, parts) per bar: one per rank, or ranks that look alike grouped. ``ranks``:
    each rank's JSON object (with ``total``), or (rank, basis, totals). Each rank's parts
    are held as machine floats until the bars are made (a window of 100,000 ranks makes
    no Python object per rank but its rank)."""
    who: list[Any] = []
    columns = [array("d") for _ in PARTS]
    for r in ranks:
        if isinstance(r, dict):
            if not r.get("total"):
                continue
            rank, parts = r["rank"], _parts(r["total"])
        else:
            rank, parts = r[0], _parts(r[2])
        who.append(rank)
        for column, (part, _, _) in zip(columns, PARTS, strict=True):
            column.append(parts[part])

    def parts_of(i: int) -> dict[str, float]:
        return {part: column[i] for column, (part, _, _) in zip(columns, PARTS, strict=True)}

    if len(who) <= MAX_BARS:
        return [([rank], parts_of(i)) for i, rank in enumerate(who)]
    longest = max(sum(column[i] for column in columns) for i in range(len(who))) or 1.0
    groups: dict[tuple[Any, ...], list[Any]] = {}
    first: dict[tuple[Any, ...], int] = {}
    for i, rank in enumerate(who):
        key = (rank == straggler, *(round(BUCKETS * column[i] / longest) for column in columns))
        groups.setdefault(key, []).append(rank)
        first.setdefault(key, i)
    order = sorted(groups, key=lambda k: (not k[0], -len(groups[k])))
    return [(groups[k], parts_of(first[k])) for k in order[:MAX_BARS]]


def svg(ranks: Iterable[Any], straggler: Any) -> str:
    """Per-rank stacked bars of one window."""
    bars = _bars(ranks, straggler)
    if not bars:
        return ""
    longest = max(sum(p.values()) for _, p in bars) or 1.0
    height = _ROW_H * len(bars) + 4
    out = [f'<svg class="bars" width="{_LABEL_W + _BAR_W + 110}" height="{height}">']
    for i, (who, p) in enumerate(bars):
        y = 2 + i * _ROW_H
        marked = straggler in who
        name = f"rank {who[0]}" if len(who) == 1 else f"{len(who)} ranks {rank_spans(who)}"
        short = name if len(name) <= 26 else name[:24] + "\u2026"
        full = name if len(name) <= 300 else name[:298] + "\u2026"
        label_class = "label marked" if marked else "label"
        out.append(f'<text class="{label_class}" x="0" y="{y + 12}">{_esc(short)}'
                   f'<title>{_esc(full)}</title></text>')
        x = float(_LABEL_W)
        for key, label, _colour in PARTS:
            w = _BAR_W * max(p[key], 0.0) / longest
            if w <= 0:
                continue
            out.append(f'<rect class="part-{key}" x="{x:.1f}" y="{y}" width="{w:.1f}" '
                       f'height="{_ROW_H - 4}"><title>{_esc(name)}: {_esc(label)} '
                       f'{ms(p[key])} ms</title></rect>')
            x += w
        if marked:
            out.append(f'<rect class="outline" x="{_LABEL_W}" y="{y - 1}" '
                       f'width="{x - _LABEL_W:.1f}" height="{_ROW_H - 2}"></rect>'
                       f'<text class="label marked" x="{x + 6:.1f}" y="{y + 12}">'
                       f'\u25c0 straggler</text>')
    out.append("</svg>")
    return "".join(out)


def _legend() -> str:
    return "".join(f'<span class="key part-{key}">{_esc(label)}</span>'
                   for key, label, _ in PARTS)


def _steps_table(rows: Sequence[StepTimes]) -> str:
    if not rows:
        return ""
    body = []
    for s in rows[:MAX_STEPS]:
        t = s["time_us"] or {}
        late = (f'rank {_esc(s["straggler"])} (+{ms(s["late_us"])} ms)'
                if s["straggler"] is not None else "-")
        body.append(f'<tr><td>{"whole trace" if s["step"] is None else _esc(s["step"])}</td>'
                    f'<td>{ms(t.get("min"))}</td><td>{ms(t.get("median"))}</td>'
                    f'<td>{ms(t.get("max"))}</td><td>{late}</td></tr>')
    more = (f'<tr><td colspan="5">\u2026 {len(rows) - MAX_STEPS} more steps '
            "(policy-engine analyze lists them)</td></tr>") if len(rows) > MAX_STEPS else ""
    return ('<table class="steps"><tr><th>ProfilerStep</th><th>min ms</th><th>median ms</th>'
            f'<th>max ms</th><th>straggler</th></tr>{"".join(body)}{more}</table>')


def window_html(window: WindowAnalysis) -> str:
    w = window
    s = w.straggler
    head = [f'<h3>{_esc(w.title)}</h3>',
            f'<p class="why">Captured because of {_esc(why(w.why))}; '
            f'{len(w.docs)} rank(s)'
            f'{", world " + _esc(w.world) if w.world else ""}.</p>']
    head += [f'<p class="note">{_esc(n)}</p>' for n in notes(w.limits, w.dropped, w.other)]
    if w.not_analysed:
        return '<div class="window">' + "".join(head) + \
            f'<p class="note">{_esc(w.not_analysed)}</p></div>'
    if s:
        others = (s.get("others_wait_us") or {}).get("median")
        head.append(f'<p class="straggler">Straggler: <span class="who">rank '
                    f'{_esc(s["rank"])}</span> in '
                    f'{len(s["steps"])} of {s["of_steps"]} steps; it arrives '
                    f'{ms(s["late_us"])} ms after the median rank. It waits '
                    f'{ms(s["wait_us"])} ms in collectives, the others {ms(others)} ms '
                    "(median).</p>")
    elif any(x["collectives"] for x in w.step_times):
        head.append('<p class="straggler">No straggler: no rank is consistently the one '
                    "the others wait for.</p>")
    warn = "".join(f'<li class="readiness"><code>{_esc(r["code"])}</code>: '
                   f'{_esc(r["message"])}'
                   + (f' (ranks {_esc(rank_spans(r["ranks"]))})' if r["ranks"] else "") + "</li>"
                   for r in w.readiness)
    regions = "".join(f'<li>{_esc(r["name"])}: {ms(t["min"])} / {ms(t["median"])} / '
                      f'{ms(t["max"])} ms</li>'
                      for r in w.regions[:5] if (t := r["time_us"]) is not None)
    figures = window.figures
    rows = figures.rows(by_rank=True) if figures is not None else iter(())
    calls = w.collectives
    compute: dict[Any, float] = {}
    if calls and figures is not None:  # the compute of the ranks that listed calls
        listed = calls["ranks"]  # by the rank's number as text
        compute = {rank: totals["compute_us"] for rank, _basis, totals in figures.rows()
                   if str(rank) in listed}
    return ('<div class="window">' + "".join(head)
            + svg(rows, s["rank"] if s else None)
            + calls_section(calls, compute, len(w.step_times))
            + _steps_table(w.step_times)
            + (f"<p>Regions (min / median / max across ranks):</p><ul>{regions}</ul>"
               if regions else "")
            + (f'<ul class="warnings">{warn}</ul>' if warn else "") + "</div>")


_STYLE = ("<style>.analysis .key{display:inline-block;padding:0 8px;margin-right:6px}"
          ".analysis .straggler{color:#8b0000} .analysis .who{font-weight:bold}"
          ".analysis .window{margin:1em 0 2em} .analysis li.readiness{color:#7a4f00}"
          ".analysis table.steps td,.analysis table.steps th{padding:1px 8px}"
          ".analysis svg text{font-size:12px} .analysis svg text.marked{font-weight:bold;"
          "fill:#c00000} .analysis rect.outline{fill:none;stroke:#c00000;stroke-width:2}"
          + "".join(f".analysis .part-{k}{{fill:{c};background:{c}}}" for k, _, c in PARTS)
          + CALLS_STYLE + "</style>")


def section(root: str, *, jobs: int = 1, max_traces: int = MAX_TRACES,
            index: Index | None = None, limits: tuple[int, int] | None = None) -> str:
    """The analysis section of the report of the run under ``root``: whole windows, oldest
    first, while their traces fit in ``max_traces`` (the page stays quick to write);
    ``index``: what the windows need of the manifests, when the report read them
    already; ``limits``: the most text read of one trace and of all the traces read
    (``--max-trace-mb``, ``--max-total-mb``): a rank whose trace is past them says so."""
    try:
        result = analyze_run(root, jobs=jobs, max_traces=max_traces, index=index,
                             limits=limits)
    except AnalysisError as err:
        return (f'<section class="analysis"><h2>Analysis</h2><p class="note">'
                f"{_esc(err)}</p></section>")
    result.close()  # the ranks' own objects are not read here: their figures are gathered
    windows = result.windows
    named = sum(1 for w in windows if w.straggler)
    body = "".join(window_html(w) for w in windows[:MAX_WINDOWS])
    more = (f'<p class="note">{len(windows) - MAX_WINDOWS} more windows are not drawn '
            "(policy-engine analyze DIR lists every one).</p>") if len(windows) > MAX_WINDOWS \
        else ""
    loose = "".join(f'<p class="note">{_esc(n["role"])} rank {_esc(n["rank"])}: '
                    f'{_esc(n["message"])}</p>' for n in result.notes[:MAX_STEPS])
    return (timeline_section(result.timeline)
            + f'<section class="analysis">{_STYLE}<h2>Analysis</h2><p>{len(windows)} capture '
            f"window(s); {named} name a straggler. Bars: each rank's profiled steps, "
            f"summed. {_legend()}</p>{loose}{body}{more}</section>")


def read_run(root: str) -> tuple[Index, Listing]:
    """The manifests under ``root`` read once for both the analysis section (what its
    windows need) and the page's listing: each line is read, checked and handed to both,
    which hold the same strings of it."""
    index = Index(from_traces=False)
    listing = Listing(root, slim=True)
    for found in read_lines(root, listing.problems, heads=True):
        listing.add(found)
        if found.line.EVENT != "open":  # the windows need none
            index.add(found.line, found.manifest, found.place)
    index.problems = listing.problems
    index.end_process()
    return index, listing
