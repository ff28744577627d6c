"""The report's stall section, first on the page: the answer of :mod:`~policy_engine.analysis.
stalls` for each episode (the newest first), as ``analyze`` words it, and a table of the
ranks: step, how long it had run, the collective it is in, where its training thread is.
Every value is escaped (the records are untrusted); the table shows at most
:data:`MAX_ROWS` ranks.
"""

from __future__ import annotations

import html
from typing import Any

from policy_engine.analysis.stalls import RankState, read_stalls, stalls_text
from policy_engine.errors import printable

MAX_ROWS = 64
_STYLE = ("<style>.stalls{border-left:4px solid #b00020;padding-left:1em}"
          ".stalls pre{white-space:pre-wrap} .stalls td,.stalls th{padding:1px 8px;"
          "text-align:left} .stalls .late{color:#b00020;font-weight:bold}</style>")


def _esc(value: Any) -> str:
    return html.escape(printable(str(value)), quote=True)


def _row(r: RankState, late: set[int]) -> str:
    call = r["collective"]
    inside = "-" if not call else (f"{call.get('name')} (group {call.get('group')}, call "
                                   f"{call.get('seq')})" + ("" if call.get("returned") is False
                                                           else ", returned"))
    where = r["where"]
    at = f"{where.get('file')}:{where.get('line')} in {where.get('function')}" \
        if where and "file" in where else "-"
    state = f"cleared after {r['cleared']:.1f} s" if r.get("cleared") is not None else \
        (f"{r['running']:.1f} s" if r.get("running") is not None else "-")
    mark = ' class="late"' if r["rank"] in late else ""
    return (f"<tr{mark}><td>{_esc(r['rank'])}</td><td>{_esc(r.get('step'))}</td>"
            f"<td>{_esc(state)}</td><td>{_esc(inside)}</td><td>{_esc(at)}</td>"
            f"<td><code>{_esc(where.get('code', '') if where else '')}</code></td></tr>")


def section(root: str) -> str:
    """The section, or nothing when the run has no stall records."""
    found = read_stalls(root)
    if found is None or not (found.episodes or found.problems):
        return ""
    doc = found.to_json()
    text = "\n".join(_esc(line) for line in stalls_text(doc))
    tables = []
    for e in doc["episodes"][:4]:
        late = {a["rank"] for c in e["collectives"] for a in c["not_reached"]}
        rows = "".join(_row(r, late) for r in e["ranks"][:MAX_ROWS])
        more = (f'<tr><td colspan="6">\u2026 {len(e["ranks"]) - MAX_ROWS} more ranks '
                "(policy-engine analyze lists them)</td></tr>") \
            if len(e["ranks"]) > MAX_ROWS else ""
        tables.append(f"<table><tr><th>rank</th><th>step</th><th>ran</th><th>collective</th>"
                      f"<th>training thread at</th><th>code</th></tr>{rows}{more}</table>")
    return (f'<section class="stalls">{_STYLE}<h2>Stalls</h2><p>What every rank was doing '
            "when a step outlived triggers.stall (records under stalls/).</p>"
            f"<pre>{text}</pre>{''.join(tables)}</section>")
