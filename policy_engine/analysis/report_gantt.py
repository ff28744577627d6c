"""The report's step timeline: each profiled training step drawn as a Gantt chart, with
who waits for whom under it (analysis/timeline.py computes what is drawn).

Rows are a role's ranks whose phases agree (``actor+ref ranks 0-1``); bars are phases,
coloured by phase name (the same colour for a name in every step); a row's waiting is
hatched (over a phase where the phase itself waits in a collective), with what it waits
for in the tooltip; the phases on the step's critical path are outlined; the axis is
milliseconds from the step's start. The SVG is plain markup (no script, nothing fetched),
every name from the manifests escaped, and the page stays bounded: at most
:data:`MAX_DRAWN` steps are drawn, each with the timeline's own bounds on rows and
phases.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

from policy_engine.errors import printable

#: Steps drawn, at most (the rest are counted).
MAX_DRAWN = 16
#: Phase colours, in the order names first appear in the run.
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948",
           "#ff9da7", "#9c755f", "#bab0ac")
_LABEL_W, _PLOT_W, _ROW_H, _BAR_H, _AXIS_H, _PAD = 230, 720, 24, 16, 40, 10


def _esc(value: Any) -> str:
    """Printable (control characters escaped: manifests are untrusted) and HTML-escaped."""
    return html.escape(printable(str(value), limit=300), quote=True)


def _ms(us: float) -> str:
    return f"{us / 1000:.1f}"


def colours(timeline: Mapping[str, Any]) -> dict[str, str]:
    """Each phase name's colour class (``ph-N``, the palette's N-th colour) in the order the
    names first appear."""
    found: dict[str, str] = {}
    for step in timeline.get("steps") or ():
        for row in step["rows"]:
            for phase in row["phases"]:
                if phase["name"] not in found:
                    found[phase["name"]] = f"ph-{len(found) % len(PALETTE)}"
    return found


def _tick(span_us: float) -> float:
    """A round tick spacing (1, 2 or 5 x 10^k ms, in µs) that gives at most 8 ticks."""
    if span_us <= 0:
        return 1000.0
    raw = span_us / 8
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * power >= raw:
            return float(m * power)
    return float(10 * power)


def _hatch(x: float, y: float, w: float) -> str:
    """The path of 45-degree strokes every 6 px across the box at (x, y), ``w`` wide and a
    bar high: the hatching of a wait, drawn as strokes (a fill pattern would need a
    ``url()`` reference, which the page keeps out)."""
    h = float(_BAR_H)
    parts = []
    c = x - h
    while c < x + w:
        x1, y1, x2, y2 = c, y + h, c + h, y
        if x1 < x:
            x1, y1 = x, y + h - (x - c)
        if x2 > x + w:
            x2, y2 = x + w, y + (c + h - (x + w))
        if x2 > x1:
            parts.append(f"M{x1:.1f} {y1:.1f}L{x2:.1f} {y2:.1f}")
        c += 6.0
    return "".join(parts)


def _who(row: Mapping[str, Any]) -> str:
    word = "rank" if row["rank_count"] == 1 else "ranks"
    return f"{row['role']} {word} {row['ranks']}"


def chart(step: Mapping[str, Any], colour: Mapping[str, str], nth: int) -> str:
    """One step's Gantt chart, as an inline SVG."""
    rows = step["rows"]
    span = step["span_us"] or 1.0
    scale = _PLOT_W / span
    on_path = {(p["role"], p["ranks"], p["phase"], p["start_us"])
               for p in step["critical_path"]}
    height = _PAD + _ROW_H * len(rows) + _AXIS_H
    width = _LABEL_W + _PLOT_W + 2 * _PAD
    out = [f'<svg class="gantt" width="{width}" height="{height}">']
    for i, row in enumerate(rows):
        y = _PAD + i * _ROW_H
        who = _who(row)
        short = who if len(who) <= 32 else who[:30] + "\u2026"
        out.append(f'<text class="row" x="0" y="{y + 13}">{_esc(short)}'
                   f"<title>{_esc(who)}</title></text>")
        lo, hi = row["span"]
        out.append(f'<rect class="span" x="{_LABEL_W + lo * scale:.1f}" y="{y + 7}" '
                   f'width="{max((hi - lo) * scale, 0.5):.1f}" height="2"/>')
        for phase in row["phases"]:
            x = _LABEL_W + phase["start_us"] * scale
            w = max((phase["end_us"] - phase["start_us"]) * scale, 0.5)
            marked = (row["role"], row["ranks"], phase["name"], phase["start_us"]) in on_path
            kind = f'phase {colour.get(phase["name"], "ph-9")}' + (" critical" if marked else "")
            out.append(f'<rect class="{kind}" x="{x:.1f}" y="{y}" width="{w:.1f}" '
                       f'height="{_BAR_H}"><title>'
                       f'{_esc(phase["name"])} on {_esc(who)}: {_ms(phase["start_us"])}-'
                       f'{_ms(phase["end_us"])} ms ({100 * phase["share"]:.0f}% of the '
                       f'step){", on the critical path" if marked else ""}</title></rect>')
        # over the phases: where a phase itself waits (its lead or tail), its colour shows
        for wait in row["waiting"]:
            x = _LABEL_W + wait["start_us"] * scale
            w = max((wait["end_us"] - wait["start_us"]) * scale, 0.5)
            out.append(f'<path class="wait" d="{_hatch(x, y, w)}"><title>{_esc(who)} waits '
                       f'{_ms(wait["end_us"] - wait["start_us"])} ms for '
                       f'{_esc(wait["for_role"])} {_esc(wait["phase"])}</title></path>')
    axis_y = _PAD + _ROW_H * len(rows) + 4
    out.append(f'<rect class="axis" x="{_LABEL_W}" y="{axis_y}" width="{_PLOT_W}" '
               'height="1"/>')
    tick = _tick(span)
    t = 0.0
    while t <= span + 1e-6:
        x = _LABEL_W + t * scale
        out.append(f'<rect class="axis" x="{x - 0.5:.1f}" y="{axis_y}" width="1" height="5"/>'
                   f'<text class="tick" x="{x:.1f}" y="{axis_y + 17}">{t / 1000:g}</text>')
        t += tick
    out.append(f'<text class="unit" x="{_LABEL_W + _PLOT_W}" y="{axis_y + 30}">ms from the '
               "step's start</text></svg>")
    return "".join(out)


def _below(step: Mapping[str, Any]) -> str:
    """Who waits for whom, the critical path, what the step lacks; the colocated rows'
    phases in sequence with their shares."""
    items = [f"<li>{_esc(w['text'])}</li>" for w in step["waits"]]
    if step["critical_path"]:
        path = " \u2192 ".join(f"{p['phase']} ({p['role']} {p['ranks']})"
                               for p in step["critical_path"])
        items.append(f'<li class="path">Critical path: {_esc(path)}</li>')
    for row in step["rows"]:
        if row["colocated"]:
            sequence = " \u2192 ".join(f"{p['name']} {100 * p['share']:.0f}%"
                                       for p in row["phases"])
            items.append(f"<li>{_esc(_who(row))}, colocated, in sequence: "
                         f"{_esc(sequence)} of the step</li>")
    items += [f'<li class="missing">No capture of {_esc(label)} in this step.</li>'
              for label in step["missing"]]
    items += [f'<li class="missing">{_esc(n)}</li>' for n in step["notes"]]
    return f'<ul class="waits">{"".join(items)}</ul>' if items else ""


_STYLE = ("<style>.timeline svg text{font-size:12px}.timeline svg text.tick{fill:#444;"
          "text-anchor:middle}.timeline svg text.unit{fill:#444;text-anchor:end}"
          ".timeline rect.axis{fill:#444}.timeline rect.span{fill:#c8c8c8}"
          ".timeline path.wait{stroke:#3f3f3f;stroke-width:1.5;fill:none}"
          ".timeline rect.critical{stroke:#000000;stroke-width:2}"
          ".timeline .key{display:inline-block;padding:0 8px;margin-right:6px;"
          "border:1px solid #888}.timeline li.missing{color:#7a4f00}"
          ".timeline .step{margin:1em 0 2em}.timeline .key.waiting{background:"
          "repeating-linear-gradient(45deg,#fff,#fff 4px,#bbb 4px,#bbb 6px)}"
          ".timeline .key.critical{border:2px solid #000}"
          + "".join(f".timeline .ph-{i}{{fill:{c};background:{c}}}" for i, c in enumerate(PALETTE))
          + "</style>")


def section(timeline: Mapping[str, Any] | None) -> str:
    """The report's timeline section ("" when no step has phases)."""
    steps = list((timeline or {}).get("steps") or ())
    if not steps or timeline is None:
        return ""
    colour = colours(timeline)
    legend = "".join(f'<span class="key {c}">{_esc(name)}</span>' for name, c in colour.items())
    legend += ('<span class="key waiting">waiting</span>'
               '<span class="key critical">critical path</span>')
    body = []
    for nth, step in enumerate(steps[:MAX_DRAWN]):
        uncertain = f" (clock uncertainty up to {_ms(step['uncertainty_us'])} ms)" \
            if step["uncertainty_us"] else ""
        body.append(f'<div class="step"><h3>{_esc(step["title"])}: {_ms(step["span_us"])} ms'
                    f"{_esc(uncertain)}</h3>{chart(step, colour, nth)}{_below(step)}</div>")
    more = (f'<p class="note">{len(steps) - MAX_DRAWN} more steps are not drawn '
            "(policy-engine timeline DIR lists every one).</p>") if len(steps) > MAX_DRAWN \
        else ""
    notes = "".join(f'<p class="note">{_esc(n)}</p>' for n in timeline.get("notes") or ())
    clock = (timeline.get("clock") or {}).get("text") or ""
    return (f'<section class="timeline">{_STYLE}<h2>The step timeline</h2><p>Every role\'s '
            "phases on every rank, step by step, on one clock: "
            f"{_esc(clock)}.</p><p>{legend}</p>{notes}{''.join(body)}{more}</section>")
