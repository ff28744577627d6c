"""Capture windows: what every rank of a role recorded for the same steps, read from the
manifests, with why each capture exists.

A window is keyed as ``merge`` keys it: the roles (``actor+ref`` for a shared capture, the
same on every rank however many of them took part there: ``analysis.window_roles``), the
region, the outer steps, the schedule cycle, and which capture of those it is when a
region or a rerun captured them again. Each window lists its torch traces (one per rank)
and what cannot be read; the trigger that opened it (plan, on demand with the request
id, signal, slow step with the rank that saw it and its seconds); a ``limits`` budget
spent; and backends that wrote nothing (a failed trace line). A folder with no manifests
(torch.profiler's own output) is one window per sub-folder of traces.
"""

from __future__ import annotations

import os
from typing import Any

from policy_engine.analysis.manifests import Scan, scan_manifests
from policy_engine.analysis.summary import problem
from policy_engine.analysis.window_roles import (
    TORCH_SUFFIXES,
    is_torch,
    participants,
    window_keys,
)

_ALSO = 16  # ranks listed whose capture has another trigger than the window's first


def describe(window: dict[str, Any]) -> str:
    """``trainer, region update, step 3, cycle 0`` for messages and headings."""
    parts = [window["role"]]
    if window.get("region") is not None:
        parts.append(f"region {window['region']}")
    steps = window.get("steps") or []
    parts.append("whole session" if not steps else f"step {steps[0]}" if len(steps) == 1
                 else f"steps {steps[0]}-{steps[-1]}")
    if window.get("cycle") is not None:
        parts.append(f"cycle {window['cycle']}")
    if window.get("capture", 1) > 1:
        parts.append(f"capture {window['capture']}")
    return ", ".join(parts)


def _why(first: dict[str, Any], notes: list[dict[str, Any]]) -> dict[str, Any]:
    """The trigger of a window's capture, with its request or the slow step behind it."""
    trigger = str(first.get("trigger") or "plan")
    why: dict[str, Any] = {"trigger": trigger, "request": first.get("request")}
    if trigger == "slow_step":
        steps = set(first.get("steps") or [])
        slow = [n for n in notes if n.get("note") == "slow_step"
                and steps & set(n.get("captures") or [])]
        why["slow"] = [{"rank": n.get("rank"), "step": n.get("step"),
                        "seconds": n.get("seconds"), "median": n.get("median")}
                       for n in sorted(slow, key=lambda n: str(n.get("rank")))]
    return why


def from_manifests(root: str, *, from_traces: bool = False, scan: Scan | None = None
                   ) -> tuple[list[dict[str, Any]], list[str], list[dict[str, Any]]]:
    """The windows under ``root`` (oldest first), problems with the manifests, and notes
    that belong to no window (a ``limits`` budget spent, a trigger request missed). A
    trace whose rank wrote its summary to the manifest carries it (``summary``) and is
    not read again, unless ``from_traces``; ``scan``: the manifests, already read."""
    scan = scan if scan is not None else scan_manifests(root)
    problems = [f"manifest {p.path}{f':{p.line}' if p.line else ''}: {p.why}"
                for p in scan.problems]
    closes: dict[tuple[str, str], dict[str, Any]] = {}
    notes: dict[str, list[dict[str, Any]]] = {}
    summaries: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for r in scan.records:
        if r["event"] == "close":
            closes[(r["_manifest"], r["capture"])] = r
        elif r["event"] == "summary" and not from_traces:
            summaries.setdefault((r["_manifest"], r.get("path")), []).append(r)
        elif r["event"] == "note":
            notes.setdefault(str(r.get("role")), []).append(r)
    traces = [r for r in scan.records if r["event"] == "trace"]
    traces.sort(key=lambda r: r["start"] if isinstance(r.get("start"), (int, float)) else 0)
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r, wkey in zip(traces, window_keys(traces), strict=True):
        name, _region, steps, _cycle, nth = wkey
        window = found.get(wkey)
        if window is None:
            role_notes = [n for role in name.split("+") for n in notes.get(role, [])]
            window = found[wkey] = {
                "role": name, "region": r.get("region"), "steps": list(steps),
                "cycle": r.get("cycle"), "capture": nth, "world": r.get("world"),
                "why": _why(r, role_notes), "traces": [], "skipped": [], "limits": [],
                "dropped": [], "other": [], "holds": [], "holders": {}, "said": []}
        # Who took part, per rank (internal: --role and the ranks a window should have).
        taking_part = participants(r)
        window["holds"].extend(x for x in taking_part if x not in window["holds"])
        if isinstance(r.get("rank"), int):
            window["holders"].setdefault(r["rank"], set()).update(taking_part)
        _place(window, r, root, closes.get((r["_manifest"], str(r.get("capture")))),
               summaries.get((r["_manifest"], r.get("path"))) or [])
    loose = [{"role": n.get("role"), "rank": n.get("rank"), "note": n.get("note"),
              "message": _loose(n)} for role in sorted(notes) for n in notes[role]
             if n.get("note") == "limit" or (n.get("note") == "trigger"
                                             and n.get("status") == "missed")]
    return list(found.values()), problems, loose


def _loose(note: dict[str, Any]) -> str:
    if note.get("note") == "limit":
        return str(note.get("message") or "a limit was reached")
    return f"trigger request {note.get('request')} missed at step {note.get('at')}"


def _place(window: dict[str, Any], r: dict[str, Any], root: str,
           close: dict[str, Any] | None, summaries: list[dict[str, Any]]) -> None:
    """One trace line into its window: a trace to read (or its summary, read already),
    or a note saying why not. ``summaries``: the summary lines of its trace (one, as its
    rank writes them)."""
    base = os.path.dirname(os.path.dirname(r["_manifest"]))
    path = r.get("path")
    full = os.path.normpath(os.path.join(base, path)) if path else None
    rel = os.path.relpath(full, root) if full else None
    rank = r.get("rank")
    if isinstance(r.get("world"), int):
        window["world"] = max(window["world"] or 0, r["world"])
    _identify(window.setdefault("identity", {}), r)
    why = window["why"]
    trigger = str(r.get("trigger") or "plan")
    if (trigger, r.get("request")) != (why["trigger"], why.get("request")):
        # a rank whose capture of these steps has another reason (bounded: the first few)
        also = why.setdefault("also", [])
        if len(also) < _ALSO:
            also.append({"rank": rank, "trigger": trigger, "request": r.get("request")})
    limit = (close or {}).get("limit")
    if isinstance(limit, str) and limit not in [x["why"] for x in window["limits"]]:
        window["limits"].append({"rank": rank, "why": limit})
    if r.get("status") == "failed" or full is None:
        window["dropped"].append({"rank": rank, "backend": r.get("backend"),
                                  "why": r.get("error") or "no file written"})
    elif not is_torch(r):
        window["other"].append({"rank": rank, "backend": r.get("backend"), "path": rel})
    else:
        readable = _inside(full, root) and os.path.isfile(full)
        found, refused, said = _summary_of(summaries, readable)
        window["said"] += [{"code": code, "rank": rank, "message": f"rank {rank}: {message}"}
                           for code, message in said]
        if found is not None:
            window["traces"].append({"rank": rank, "path": rel, "file": None,
                                     "status": r.get("status"), "summary": found})
        elif readable:
            window["traces"].append({"rank": rank, "path": rel, "file": full,
                                     "status": r.get("status")})
        else:
            why = ("outside the folder analysed: not read" if not _inside(full, root)
                   else _absent(full))
            if refused:  # the summary was there: say why it is not used
                why = f"its summary cannot be used ({refused}), and the trace cannot be " \
                      f"read instead: {why}"
            window["skipped"].append({"rank": rank, "path": rel, "why": why})


#: What a trace line says of how it was recorded, gathered per window for the comparison
#: of two runs (each value as seen on any rank: a window normally has one of each).
IDENTITY = ("policy_hash", "torch", "recorded")


def _identify(identity: dict[str, Any], r: dict[str, Any]) -> None:
    for key in IDENTITY:
        value = r.get(key)
        if value is not None:
            seen = identity.setdefault(key, [])
            if value not in seen and len(seen) < _ALSO:
                seen.append(value)
    coords = r.get("coords")
    if isinstance(coords, dict):  # the mesh, as far as the ranks' coordinates show it
        mesh = identity.setdefault("mesh", {})
        for dim, at in coords.items():
            if isinstance(at, int) and not isinstance(at, bool) and 0 <= at < 1 << 31:
                mesh[str(dim)] = max(mesh.get(str(dim), 0), at + 1)


def _summary_of(records: list[dict[str, Any]], readable: bool
                ) -> tuple[dict[str, Any] | None, str | None, list[tuple[str, str]]]:
    """From the summary lines of one trace (one, as its rank writes them): the figures to
    use, where its rank summarised it whole and they are what
    :func:`~policy_engine.analysis.summary.summarize` returns (a manifest is untrusted:
    anything else and the trace is read, if it is there: ``readable``); why a complete
    summary is refused; and what the window's readiness says (code, message). Lines that
    differ are not chosen between where the trace can be read instead; where it cannot,
    the first usable one is used, and that is said."""
    lines: list[dict[str, Any]] = []  # those that differ
    for r in records:
        if all((r.get("status"), r.get("summary")) != (x.get("status"), x.get("summary"))
               for x in lines):
            lines.append(r)
    usable, refused = [], None
    for r in lines:
        why = problem(r.get("summary")) if r.get("status") == "complete" else "not complete"
        if why is None:
            usable.append(r)
        elif r.get("status") == "complete":
            refused = refused or why
    if len(lines) > 1:
        twice = f"its trace has {len(lines)} summary lines that differ"
        if readable:
            return None, None, [("duplicate_rank", f"{twice}: the trace is read instead")]
        if usable:
            return usable[0].get("summary"), None, [("duplicate_rank", (
                f"{twice}, and the trace is not there to read: the first usable one (line "
                f"{usable[0]['_line']} of {os.path.basename(usable[0]['_manifest'])}) is "
                "used"))]
        return None, refused, [("duplicate_rank", f"{twice}; none can be used")]
    if usable:
        return usable[0].get("summary"), None, []
    if refused is not None and readable:
        return None, refused, [("summary_refused", f"its summary cannot be used ({refused}): "
                                "the trace is read instead")]
    return None, refused, []


def _absent(path: str) -> str:
    """Why a trace the manifest names cannot be read as one: not there, or not a file."""
    if not os.path.lexists(path):
        return "missing: the manifest names it, but it is not on disk"
    return "not a regular file (a folder, a FIFO or a device where the trace should be)"


def _inside(path: str, root: str) -> bool:
    """Whether ``path`` (links resolved) lies under ``root``: a manifest is untrusted, and
    a trace it names elsewhere is not read."""
    top = os.path.realpath(root)
    return os.path.commonpath([top, os.path.realpath(path)]) == top


def from_folders(root: str) -> list[dict[str, Any]]:
    """Without manifests: each folder holding torch traces is one window (ranks come
    from each trace's distributedInfo once it is read)."""
    windows = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        names = sorted(f for f in files if f.endswith(TORCH_SUFFIXES))
        if not names:
            continue
        rel = os.path.relpath(folder, root)
        windows.append({
            "role": rel if rel != "." else os.path.basename(os.path.abspath(root)),
            "region": None, "steps": [], "cycle": None, "capture": 1, "world": None,
            "why": None, "traces": [{"rank": None, "path": os.path.normpath(os.path.join(rel, n)),
                                     "file": os.path.join(folder, n), "status": None}
                                    for n in names],
            "skipped": [], "limits": [], "dropped": [], "other": []})
    return windows
