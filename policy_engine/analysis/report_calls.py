"""The report's view of one window's collective calls: who arrived last and why, and per
rank its compute beside its wait for the last arrival and the transfer, on one scale in
milliseconds per step; then the process groups by bus bandwidth.

Plain markup (inline SVG, no script); every value from a run is escaped. At most
:data:`MAX_BARS` bars: ranks that look alike (each part within 1/:data:`BUCKETS` of the
longest bar) share one, the late rank always its own.
"""

from __future__ import annotations

import html
from array import array
from collections.abc import Mapping
from typing import Any

from policy_engine.analysis.format import rank_spans
from policy_engine.analysis.text import ms
from policy_engine.errors import printable

#: (key, label, colour): a bar's parts, left to right.
PARTS = (("compute", "compute", "#4e79a7"), ("wait", "waiting for the last arrival",
                                              "#e15759"),
         ("transfer", "transfer", "#f28e2b"))
MAX_BARS, BUCKETS, GROUPS = 32, 20, 8
_LABEL_W, _BAR_W, _ROW_H, _AXIS_H = 170, 440, 18, 24


def _esc(value: Any) -> str:
    return html.escape(printable(str(value)), quote=True)


def _rows(compute: Mapping[Any, float], ranks: Mapping[str, Any],
          steps: int) -> tuple[list[Any], list[array[float]]]:
    """The ranks in order (numbers first, by number) and, per part of :data:`PARTS`, a
    column of each rank's µs per step: machine floats, not an object per rank (a window
    of 100,000 ranks)."""
    per = max(steps, 1)
    who: list[Any] = []
    for key in ranks:
        try:
            who.append(int(key))
        except ValueError:
            who.append(key)
    order = sorted(range(len(who)), key=lambda i: (not isinstance(who[i], int), str(who[i])
                                                   if not isinstance(who[i], int) else who[i]))
    found = list(ranks.values())
    columns = [array("d") for _ in PARTS]
    for i in order:
        r = found[i]
        columns[0].append(compute.get(who[i], 0.0) / per)
        columns[1].append(max(r["wait_us"], 0.0) / per)
        columns[2].append(max(r["transfer_us"], 0.0) / per)
    return [who[i] for i in order], columns


def _bars(who: list[Any], columns: list[array[float]],
          late: Any) -> list[tuple[list[Any], dict[str, float]]]:
    def parts_of(i: int) -> dict[str, float]:
        return {part: column[i] for (part, _, _), column in zip(PARTS, columns, strict=True)}

    if len(who) <= MAX_BARS:
        return [([rank], parts_of(i)) for i, rank in enumerate(who)]
    longest = max((sum(column[i] for column in columns) for i in range(len(who))),
                  default=0.0) or 1.0
    groups: dict[tuple[Any, ...], list[Any]] = {}
    first: dict[tuple[Any, ...], int] = {}
    for i, rank in enumerate(who):
        key = (rank == late, *(round(BUCKETS * column[i] / longest) for column in columns))
        groups.setdefault(key, []).append(rank)
        first.setdefault(key, i)
    order = sorted(groups, key=lambda k: (not k[0], -len(groups[k])))
    return [(groups[k], parts_of(first[k])) for k in order[:MAX_BARS]]


def _ticks(longest: float) -> list[float]:
    """Round scale marks (µs) up to ``longest``."""
    if longest <= 0:
        return [0.0]
    step = 10 ** len(str(int(longest / 4))) / 10 if longest >= 4 else 1.0
    for factor in (1, 2, 5, 10):
        if longest / (step * factor) <= 5:
            step *= factor
            break
    marks, at = [], 0.0
    while at <= longest:
        marks.append(at)
        at += step
    return marks


def svg(rows: tuple[list[Any], list[array[float]]], late: Any) -> str:
    """Per rank (:func:`_rows`): compute, wait and transfer per step, on one axis (ms)."""
    bars = _bars(*rows, late)
    if not bars:
        return ""
    longest = max(sum(p.values()) for _, p in bars) or 1.0
    height = _ROW_H * len(bars) + _AXIS_H + 4
    out = [f'<svg class="calls" width="{_LABEL_W + _BAR_W + 90}" height="{height}">']
    for i, (who, p) in enumerate(bars):
        y = 2 + i * _ROW_H
        name = f"rank {who[0]}" if len(who) == 1 else f"{len(who)} ranks {rank_spans(who)}"
        short = name if len(name) <= 26 else name[:24] + "\u2026"
        marked = late in who
        out.append(f'<text class="label{" marked" if marked else ""}" x="0" y="{y + 12}">'
                   f'{_esc(short)}<title>{_esc(name[:300])}</title></text>')
        x = float(_LABEL_W)
        for key, label, _colour in PARTS:
            w = _BAR_W * p[key] / longest
            if w > 0:
                out.append(f'<rect class="call-{key}" x="{x:.1f}" y="{y}" width="{w:.1f}" '
                           f'height="{_ROW_H - 4}"><title>{_esc(name)}: {_esc(label)} '
                           f'{ms(p[key])} ms per step</title></rect>')
                x += w
    axis = 2 + len(bars) * _ROW_H
    out.append(f'<line class="axis" x1="{_LABEL_W}" y1="{axis}" x2="{_LABEL_W + _BAR_W}" '
               f'y2="{axis}"></line>')
    for mark in _ticks(longest):
        x = _LABEL_W + _BAR_W * mark / longest
        out.append(f'<line class="axis" x1="{x:.1f}" y1="{axis}" x2="{x:.1f}" '
                   f'y2="{axis + 4}"></line><text class="tick" x="{x:.1f}" '
                   f'y="{axis + 16}">{_esc(ms(mark))}</text>')
    out.append(f'<text class="tick" x="{_LABEL_W + _BAR_W + 4}" y="{axis + 16}">ms per '
               "step</text></svg>")
    return "".join(out)


def section(found: Mapping[str, Any] | None, compute: Mapping[Any, float],
            steps: int) -> str:
    """A window's collective calls, or nothing where no rank listed one. ``compute``:
    each rank's compute over the window (µs); ``steps``: the window's steps."""
    if not found:
        return ""
    late = found["late"]
    calls = found["calls"]
    said = [f"<p>Collective calls: {calls['matched']} of {calls['listed']} matched across "
            "ranks by (group, number).</p>"]
    if late.get("rank") is not None:
        cause = (late.get("cause") or {}).get("text") or ""
        said.append(f'<p class="straggler">Late rank: <span class="who">rank '
                    f'{_esc(late["rank"])}</span> arrived last in {_esc(late["votes"])} of '
                    f'{_esc(late["calls"])} calls (p = {late["p_value"]:.2g}). '
                    f"{_esc(cause)}</p>")
    elif late.get("cause"):
        said.append(f"<p>{_esc(late['cause']['text'])}</p>")
    legend = "".join(f'<span class="key call-{k}">{_esc(label)}</span>'
                     for k, label, _ in PARTS)
    rows = []
    for g in found["groups"][:GROUPS]:
        busbw = "-" if g["busbw_gbps"] is None else f"{g['busbw_gbps']:.3g}"
        cells = (g["name"], g["size"] or "?", g["calls"], f"{g['bytes']:,}", busbw)
        rows.append("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in cells) + "</tr>")
    table = ("<table class=\"steps\"><tr><th>group</th><th>ranks</th><th>calls</th>"
             f"<th>bytes</th><th>bus bandwidth GB/s (median)</th></tr>{''.join(rows)}</table>"
             if rows else "")
    return (f'<div class="calls">{"".join(said)}<p>{legend}</p>'
            f"{svg(_rows(compute, found['ranks'], steps), late.get('rank'))}{table}</div>")


STYLE = ("".join(f".analysis .call-{k}{{fill:{c};background:{c}}}" for k, _, c in PARTS)
         + ".analysis svg.calls line.axis{stroke:#555} .analysis svg text.tick{"
         "font-size:10px;fill:#555}")
