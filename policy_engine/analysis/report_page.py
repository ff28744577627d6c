"""The HTML of ``policy-engine report``: one static page, inline CSS, no script.

Every value that comes from a manifest or a trace is escaped (manifests are untrusted
input). Per role a grid of ranks by steps; ranks whose captures had the same outcome at
every step share one row, so a 4,096-rank run whose ranks all did well is one row.
"""

from __future__ import annotations

import html
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any, Literal
from urllib.parse import quote

import attrs

from policy_engine.analysis.format import rank_spans, size_cell
from policy_engine.analysis.listing import Captures, ListedRow, PageRow
from policy_engine.analysis.listing import cell as _cell
from policy_engine.analysis.listing import roles_cell as _roles
from policy_engine.analysis.listing import steps_cell as _steps
from policy_engine.analysis.listing import summary_line as _summary
from policy_engine.analysis.window_roles import families
from policy_engine.errors import is_int
from policy_engine.files.records import Status

#: Most severe first: the order of the attention list and of the grid's rows.
SEVERITY = ("failed", "oom", "interrupted", "partial", "running", "complete")
SYMBOL = {"complete": "\u2713", "partial": "P", "failed": "F", "interrupted": "I",
          "oom": "M", "running": "R"}
COLOUR = {"complete": "#b7e1b0", "partial": "#ffd27f", "failed": "#f08080",
          "interrupted": "#c9a3e6", "oom": "#ff8c42", "running": "#9cc7f0"}
#: The most entries a list of files (unlisted, missing, ...) shows.
LIST_LIMIT = 200
#: The most captures a role's list of every capture shows (those that need attention
#: first, then by rank): a page of 100,000 ranks stays a page; `traces` lists them all.
CAPTURE_ROWS = 2000


@attrs.frozen
class Ops:
    """The top operators of one trace by self time (``rows``: name, category, self
    microseconds, calls), or why there are none (``why``)."""

    rows: tuple[tuple[str, str, float, int], ...] = ()
    why: str | None = None


@attrs.frozen
class PageEntry:
    """One entry of the page (a grid cell holds one or more): a trace line, or a capture
    that never closed."""

    role: str
    rank: int | None
    column: tuple[Any, ...]  # (sort key, label)
    status: str
    record: ListedRow | PageRow
    path: str | None  # relative to DIR
    href: str | None  # relative to the page
    exists: bool
    message: str | None

    @property
    def severity(self) -> int:
        return SEVERITY.index(self.status) if self.status in SEVERITY else 0

    @property
    def lost(self) -> bool:
        """A file the manifest names that is not on disk."""
        return self.path is not None and not self.exists

    @property
    def troubled(self) -> bool:
        return self.status != Status.COMPLETE or self.lost


def _esc(value: Any) -> str:
    """Printable (control characters escaped) and HTML-escaped."""
    return html.escape(_cell(value), quote=True)


def _column(record: ListedRow | PageRow) -> tuple[Any, ...]:
    steps = record.get("steps") or []
    first = steps[0] if steps else None
    label = "session" if not steps else _steps(record)
    region = record.get("region")
    if region:
        label = f"{label} {region}"
    key = ((0, first, "") if is_int(first)
           else (1, 0, str(first)) if steps else (2, 0, ""))
    return (key, str(region or "")), label


def captures(data: Captures, root: str, page_dir: str) -> list[PageEntry]:
    """Every trace line and every capture that never closed, as page entries."""
    out = []
    # Paths are relative to root and stay inside it: one relpath serves every link.
    up = os.path.relpath(os.path.abspath(root), page_dir)
    # One section per window family: a shared capture whose roles differ by rank (verl's
    # rollout on rank 0 only) is one role on the page, not two.
    family = families([*data["traces"], *data["interrupted"]])
    for r in [*data["traces"], *data["interrupted"]]:
        rank = r.get("rank")
        path = r.get("path") if r.get("event") != "capture" else None
        href = None
        if path:
            rel = os.path.normpath(os.path.join(up, path))
            href = "./" + quote(rel.replace(os.sep, "/"), safe="/")
        message = r.get("reason") if r.get("event") == "capture" else r.get("error")
        if r.get("kept") is False and not r.get("exists"):  # keep: summaries removed it
            path, href, message = None, None, "summary only: the trace was not kept"
        out.append(PageEntry(
            role=family[_roles(r)], rank=rank if isinstance(rank, int) else None,
            column=_column(r), status=str(r.get("status")), record=r,
            path=path, href=href, exists=bool(r.get("exists", path is None)),
            message=message))
    return out


def _weight(c: PageEntry) -> int:
    """How bad an entry is: a lost file counts as a partial capture at least."""
    return min(c.severity, SEVERITY.index(Status.PARTIAL)) if c.lost else c.severity


def _cell_status(entries: Sequence[PageEntry]) -> str:
    return min(entries, key=lambda c: c.severity).status


def _signature(cells: dict[Any, list[PageEntry]], columns: list[Any]) -> tuple[Any, ...]:
    return tuple(tuple(sorted((c.status, c.exists) for c in cells.get(col, ())))
                 for col in columns)


def _grid(role: str, entries: list[PageEntry]) -> str:
    columns = sorted({c.column for c in entries})
    per_rank: dict[int | None, dict[Any, list[PageEntry]]] = {}
    for c in entries:
        per_rank.setdefault(c.rank, {}).setdefault(c.column, []).append(c)
    groups: dict[tuple[Any, ...], list[int | None]] = {}
    for rank, cells in per_rank.items():
        groups.setdefault(_signature(cells, columns), []).append(rank)

    def order(item: tuple[tuple[Any, ...], list[int | None]]) -> tuple[int, int]:
        ranks = item[1]  # every rank of a group has the same outcomes: look at one
        worst = min((_weight(c) for cell in per_rank[ranks[0]].values() for c in cell),
                    default=len(SEVERITY))
        return worst, min((r for r in ranks if r is not None), default=-1)

    head = "".join(f'<th class="col">{_esc(label)}</th>' for _key, label in columns)
    rows = []
    for _sig, ranks in sorted(groups.items(), key=order):
        text = rank_spans(ranks)
        count = len(ranks)
        label = f"rank {text}" if count == 1 else f"ranks {text} ({count})"
        tds = []
        for col in columns:
            found = [c for r in ranks for c in per_rank[r].get(col, ())]
            if not found:
                tds.append('<td class="empty"></td>')
                continue
            status = _cell_status(found)
            lost = sum(1 for c in found if c.lost)
            per = len(found) // count if len(found) % count == 0 else None
            mark = SYMBOL.get(status, "?") + (f"\u00d7{per}" if per and per > 1 else "")
            total = sum(b for c in found if isinstance(b := c.record.get("bytes"), int))
            tip = (f"{role} step {col[1]}: {len(found)} capture(s) on {count} rank(s), "
                   f"{status}; {size_cell(total)}"
                   + (f"; {lost} file(s) missing" if lost else ""))
            tds.append(
                f'<td class="s-{_esc(status)}{" lost" if lost else ""}" '
                f'data-role="{_esc(role)}" data-ranks="{_esc(text)}" '
                f'data-col="{_esc(col[1])}" data-status="{_esc(status)}" '
                f'title="{_esc(tip)}">{_esc(mark)}</td>')
        rows.append(f'<tr><th class="ranks" title="{_esc(text)}">{_esc(label)}</th>'
                    + "".join(tds) + "</tr>")
    return (f'<div class="grid"><table data-role="{_esc(role)}"><tr><th>ranks \\ step</th>'
            f'{head}</tr>\n' + "\n".join(rows) + "</table></div>")


def _ops(ops: Ops | None) -> str:
    if ops is None:
        return ""
    if ops.why:
        return f'<span class="note">{_esc(ops.why)}</span>'
    if not ops.rows:
        return '<span class="note">no operators in the trace</span>'
    body = "".join(
        f'<tr><td>{_esc(name)}</td><td>{_esc(cat)}</td>'
        f'<td class="n">{self_us / 1000:.3f}</td><td class="n">{calls}</td></tr>'
        for name, cat, self_us, calls in ops.rows)
    return (f'<details><summary>top {len(ops.rows)} operators</summary><table class="ops">'
            '<tr><th>operator</th><th>category</th><th>self ms</th><th>calls</th></tr>'
            f"{body}</table></details>")


def _listing(entries: list[PageEntry], ops: dict[int, Ops]) -> str:
    rows = []
    shown = entries
    if len(entries) > CAPTURE_ROWS:  # those that need attention first
        shown = sorted(entries, key=lambda c: (not c.troubled, c.rank if c.rank is not None
                                               else -1))[:CAPTURE_ROWS]
    for c in sorted(shown, key=lambda c: (c.rank if c.rank is not None else -1,
                                          c.column, _number(c.record.get("start")))):
        r = c.record
        if c.href is not None:
            target = (f'<a href="{html.escape(c.href, quote=True)}">{_esc(c.path)}</a>'
                      + ("" if c.exists else ' <span class="bad">(missing)</span>'))
        else:
            target = f'<span class="note">({_esc(c.message or "no file")})</span>'
        cycle = r.get("cycle")
        rows.append(
            f'<tr class="s-{_esc(c.status)}"><td class="n">{_esc(_rank_text(c.rank))}</td>'
            f'<td>{_esc(c.column[1])}</td><td>{"-" if cycle is None else _esc(cycle)}</td>'
            f'<td>{_esc(c.status)}</td><td class="n">{_esc(size_cell(r.get("bytes")))}</td>'
            f'<td><code>{_esc(r.get("plan_hash") or "-")}</code></td>'
            f"<td>{target}</td><td>{_ops(ops.get(id(c)))}</td></tr>")
    more = (f'<p class="note">{len(entries) - len(shown)} more captures are not listed '
            "here (those that need attention come first; policy-engine traces DIR lists "
            "every one).</p>") if len(shown) < len(entries) else ""
    return ("<table class=\"list\"><tr><th>rank</th><th>step</th><th>cycle</th>"
            "<th>status</th><th>size</th><th>plan hash</th><th>file</th><th>operators</th>"
            "</tr>\n" + "\n".join(rows) + "</table>" + more)


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def _rank_text(rank: int | None) -> str:
    return "?" if rank is None else str(rank)


def _counted(values: Iterable[Any], limit: int = 8) -> str:
    """Distinct values with how often each occurs, the most frequent first."""
    counts: dict[str, int] = {}
    for v in values:
        text = _cell("-" if v is None else v)
        counts[text] = counts.get(text, 0) + 1
    shown = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"<code>{html.escape(k)}</code> ({n})" for k, n in shown[:limit])
    return text + (f", and {len(shown) - limit} more" if len(shown) > limit else "")


def _attention(entries: list[PageEntry]) -> str:
    """Troubled captures grouped by role, outcome, message and step, ranks as ranges."""
    groups: dict[tuple[Any, ...], list[PageEntry]] = {}
    for c in entries:
        if c.troubled:
            status = c.status if c.exists else f"{c.status}, file missing"
            key = (c.severity, c.role, status, c.message or "", c.column)
            groups.setdefault(key, []).append(c)
    if not entries:
        return '<p class="note">No manifest under this folder records a capture.</p>'
    if not groups:
        return '<p class="good">Nothing: every capture completed, its files on disk.</p>'
    rows = []
    for (_sev, role, status, message, column), found in sorted(groups.items()):
        first = found[0]
        link = (f'<a href="{html.escape(first.href, quote=True)}">{_esc(first.path)}</a>'
                if first.href and len(found) == 1 else "")
        rows.append(
            f'<tr class="s-{_esc(first.status)}{"" if first.exists else " lost"}">'
            f"<td>{_esc(role)}</td>"
            f'<td>{_esc(rank_spans(c.rank for c in found))}</td><td>{_esc(column[1])}</td>'
            f"<td>{_esc(status)}</td><td>{_esc(message) or '-'}</td><td>{link}</td></tr>")
    return ('<table class="list"><tr><th>role</th><th>ranks</th><th>step</th><th>outcome</th>'
            "<th>error</th><th>file</th></tr>\n" + "\n".join(rows) + "</table>")


#: The lists of files the page shows: (key in the listing, what they are).
_FILES: tuple[tuple[Literal["missing", "unlisted", "leftovers", "writing"], str], ...] = (
    ("missing", "named by a manifest, not on disk"),
    ("unlisted", "on disk, named by no manifest"),
    ("leftovers", "interrupted saves (safe to delete)"),
    ("writing", "saves in progress"))


def _files(data: Captures) -> str:
    parts = []
    for key, what in _FILES:
        items = data[key]
        if items:
            shown = "".join(f"<li>{_esc(p)}</li>" for p in items[:LIST_LIMIT])
            more = (f"<li>and {len(items) - LIST_LIMIT} more (policy-engine traces lists "
                    "them all)</li>" if len(items) > LIST_LIMIT else "")
            parts.append(f"<h3>{len(items)} {what}</h3><ul>{shown}{more}</ul>")
    bad = [f"{b['manifest']}:{b['line']}: {b['why']}" for b in data["bad_lines"]]
    bad += [f"{b['path']}: {b['why']}" for b in data["unreadable"]]
    if bad:
        shown = "".join(f"<li>{_esc(b)}</li>" for b in bad[:LIST_LIMIT])
        parts.append(f'<h3 class="bad">{len(bad)} manifest problem(s)</h3><ul>{shown}</ul>')
    return "\n".join(parts)


_STYLE = """
body{font:14px/1.4 sans-serif;margin:24px;color:#222} table{border-collapse:collapse}
th,td{padding:2px 6px;text-align:left;vertical-align:top;border-bottom:1px solid #eee}
td.n{text-align:right;white-space:nowrap} .note{color:#666} .bad{color:#b00020}
.good{color:#2e7d32} .grid{overflow:auto;max-width:100%} code{font-size:12px}
.grid td{text-align:center;min-width:18px;border:1px solid #fff;font-size:12px}
.grid th.ranks{white-space:nowrap;max-width:40em;overflow:hidden;text-overflow:ellipsis}
.grid td.lost{outline:2px dashed #b00020;outline-offset:-3px} td.empty{background:#f4f4f4}
.legend span{display:inline-block;padding:0 8px;margin-right:6px}
table.ops td{border:0;padding:0 6px} summary{cursor:pointer}
""" + "".join(f".s-{s}{{background:{c}}}\n" for s, c in COLOUR.items()) + \
    "tr.s-complete{background:none} tr.lost{background:#fde0e0}\n"


def render(data: Captures, entries: list[PageEntry], ops: dict[int, Ops], *,
           title: str, notes: Sequence[str], extra: Sequence[str] = (),
           first: Sequence[str] = ()) -> str:
    """The whole page. ``extra``: more sections of HTML (escaped by whoever made them),
    placed after the roles' sections; ``first``: sections placed before everything else
    (a hung job's answer)."""
    roles: dict[str, list[PageEntry]] = {}
    for c in entries:
        roles.setdefault(c.role, []).append(c)
    sections = []
    for role in sorted(roles):
        found = roles[role]
        records = [c.record for c in found]
        troubled = sum(1 for c in found if c.troubled)
        sections.append(
            f'<section><h2>{_esc(role)}</h2><p>{len(found)} capture(s) on '
            f'{len({c.rank for c in found})} rank(s)'
            + (f', <span class="bad">{troubled} need attention</span>' if troubled else "")
            + f". Policy file: {_counted(r.get('policy_file') for r in records)}; "
            f"policy hash: {_counted(r.get('policy_hash') for r in records)}; "
            f"plan hashes: {_counted((r.get('plan_hash') for r in records), 4)}.</p>"
            + _grid(role, found)
            + f"<details><summary>every capture of {_esc(role)} ({len(found)}), with its "
            f"file</summary>{_listing(found, ops)}</details></section>")
    legend = "".join(f'<span class="s-{s}">{SYMBOL[s]} {s}</span>' for s in SEVERITY)
    policies = _counted(f"{c.record.get('policy_file') or '(a mapping)'} "
                        f"{c.record.get('policy_hash') or '-'}" for c in entries)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"/><title>{_esc(title)}</title>
<style>{_STYLE}</style></head><body>
<h1>{_esc(title)}</h1>
<p>{_esc(_summary(data))}. Written {html.escape(time.strftime("%Y-%m-%d %H:%M:%S"))}.</p>
<p>Policies (file, hash): {policies or "none"}.</p>
{"".join(f'<p class="note">{_esc(n)}</p>' for n in notes)}
{"".join(first)}
<h2>Needs attention</h2>
{_attention(entries)}
<p class="legend">{legend}<span class="lost">dashed: file missing</span>
&#215;N: N captures per rank in the cell. Hover a cell for sizes.</p>
{"".join(sections)}
{"".join(extra)}
{_files(data)}
</body></html>
"""
