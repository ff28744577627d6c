"""Capture windows: what every rank of a role recorded for the same steps, read from the
manifests, with why each capture exists.

A window is keyed as ``merge`` keys it: the roles (``actor+ref`` for a shared capture, the
same on every rank however many of them took part there: ``analysis.window_roles``), the
region, the outer steps, the schedule cycle, and which capture of those it is when a
region or a rerun captured them again. Each window lists its torch traces (one per rank:
an :class:`Entry`) and what cannot be read; the trigger that opened it (plan, on demand
with the request id, signal, slow step with the rank that saw it and its seconds); a
``limits`` budget spent; and backends that wrote nothing (a failed trace line). A folder
with no manifests (torch.profiler's own output) is one window per sub-folder of traces.

The manifests are read once, a line at a time, and only what the windows need is kept:
each trace line as a small tuple whose repeated values (roles, steps, the policy's hash)
are shared, and of each summary line only where it lies, so that a run of 100,000 ranks
is indexed in tens of megabytes; the summaries are read again, one at a time, when their
window is analysed.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from policy_engine.analysis.manifests import (
    Found,
    ManifestProblem,
    Place,
    Scan,
    process_of,
    read_lines,
)
from policy_engine.analysis.window_roles import (
    TORCH_SUFFIXES,
    is_torch,
    participants,
    window_keys,
)

_ALSO = 16  # ranks listed whose capture has another trigger than the window's first
#: The notes kept from all the manifests (limits reached, trigger requests missed...);
#: past it they are counted, not kept.
MAX_NOTES = 10_000


class Entry(NamedTuple):
    """One torch trace of a window: where it is (``path`` relative to the folder
    analysed; ``file`` to read, None where only its summary is kept) and its rank's
    summary line (``summary``: where it lies, read when the window is analysed)."""

    rank: Any
    path: str | None
    file: str | None
    status: Any
    summary: Place | None


class _Trace(NamedTuple):
    """A trace line as a window needs it (the fields ``window_roles`` reads through
    :meth:`get`)."""

    manifest: str
    capture: Any
    role: Any
    roles: Any
    joined: Any
    region: Any
    steps: Any
    cycle: Any
    rank: Any
    world: Any
    backend: Any
    path: Any
    status: Any
    error: Any
    start: Any
    trigger: Any
    request: Any
    identity: tuple[Any, ...]

    def get(self, key: str, default: Any = None) -> Any:
        value = getattr(self, key, default)
        return default if value is None else value


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


def _why(first: _Trace, notes: list[dict[str, Any]]) -> dict[str, Any]:
    """The trigger of a window's capture, with its request or the slow step behind it."""
    trigger = str(first.trigger or "plan")
    why: dict[str, Any] = {"trigger": trigger, "request": first.request}
    if trigger == "slow_step":
        steps = set(first.steps or ())
        slow = [n for n in notes if n.get("note") == "slow_step"
                and steps & set(_hashable(n.get("captures")) or ())]
        why["slow"] = [{"rank": n.get("rank"), "step": n.get("step"),
                        "seconds": n.get("seconds"), "median": n.get("median")}
                       for n in sorted(slow, key=lambda n: str(n.get("rank")))]
    return why


#: What a trace line says of how it was recorded, gathered per window for the comparison
#: of two runs (each value as seen on any rank: a window normally has one of each).
IDENTITY = ("policy_hash", "torch", "recorded", "coords")


def _hashable(value: Any) -> Any:
    """A JSON value as a hashable one (lists as tuples, objects as sorted item tuples)."""
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return ("{}", *sorted((str(k), _hashable(v)) for k, v in value.items()))
    return value


def _plain(value: Any) -> Any:
    """:func:`_hashable` undone: the JSON value again."""
    if isinstance(value, tuple):
        if value[:1] == ("{}",):
            return {k: _plain(v) for k, v in value[1:]}
        return [_plain(v) for v in value]
    return value


class _Shared:
    """Values seen before, handed out again: 100,000 ranks' lines name the same roles,
    steps and policy, and hold them once."""

    def __init__(self) -> None:
        self._seen: dict[Any, Any] = {}

    def __call__(self, value: Any) -> Any:
        if isinstance(value, (list, dict)):
            value = _hashable(value)
        try:
            return self._seen.setdefault(value, value)
        except TypeError:  # pragma: no cover - JSON values are hashable once converted
            return value


def _compact(r: dict[str, Any], manifest: str, share: _Shared) -> _Trace:
    return _Trace(
        manifest=manifest, capture=r.get("capture"), role=share(r.get("role")),
        roles=share(r.get("roles")), joined=share(r.get("joined")),
        region=share(r.get("region")), steps=share(r.get("steps")), cycle=r.get("cycle"),
        rank=r.get("rank"), world=r.get("world"), backend=share(r.get("backend")),
        path=r.get("path"), status=share(r.get("status")), error=r.get("error"),
        start=r.get("start"), trigger=share(r.get("trigger")),
        request=r.get("request"),
        identity=share(tuple(share(r.get(k)) for k in IDENTITY)))


class Index:
    """What the windows need of the manifests, gathered a line at a time."""

    def __init__(self, *, from_traces: bool) -> None:
        self.from_traces = from_traces
        self.share = _Shared()
        self.traces: list[_Trace] = []
        self.limits: dict[tuple[str, str], str] = {}  # a close line's limit, by capture
        self.summaries: dict[tuple[str, Any], Place | dict[str, Any]] = {}
        self.notes: dict[str, list[dict[str, Any]]] = {}
        self.notes_left_out = 0

    def add(self, r: dict[str, Any], manifest: str, place: Place | None) -> None:
        """One record (a manifest line as a dict; ``place``: where it lies)."""
        event = r["event"]
        if event == "trace":
            self.traces.append(_compact(r, manifest, self.share))
        elif event == "close":
            if isinstance(r.get("limit"), str):
                self.limits[(manifest, str(r.get("capture")))] = r["limit"]
        elif event == "summary" and not self.from_traces:
            if r.get("status") == "complete":  # else the trace is read, if it is there
                self.summaries[(manifest, r.get("path"))] = place if place else r["summary"]
            else:
                self.summaries.pop((manifest, r.get("path")), None)
        elif event == "note":
            if sum(map(len, self.notes.values())) < MAX_NOTES:
                kept = {k: v for k, v in r.items() if not k.startswith("_")}
                self.notes.setdefault(str(r.get("role")), []).append(kept)
            else:
                self.notes_left_out += 1

    def read(self, root: str, problems: list[ManifestProblem]) -> None:
        for found in read_lines(root, problems):
            self.add(_record(found), found.manifest, found.place)


def _record(found: Found) -> dict[str, Any]:
    line = found.line
    if line.EVENT == "summary":  # its figures are read again when needed, by its place
        return {"event": "summary", "path": line.path, "status": line.status,
                "summary": None}
    return line.to_json()


def from_manifests(root: str, *, from_traces: bool = False, scan: Scan | None = None
                   ) -> tuple[list[dict[str, Any]], list[str], list[dict[str, Any]]]:
    """The windows under ``root`` (oldest first), problems with the manifests, and notes
    that belong to no window (a ``limits`` budget spent, a trigger request missed). A
    trace whose rank wrote its summary to the manifest carries it (``summary``: where the
    line lies, or the figures themselves when ``scan`` holds them) and is not read again,
    unless ``from_traces``; ``scan``: the manifests, already read."""
    index = Index(from_traces=from_traces)
    found_problems: list[ManifestProblem] = []
    if scan is None:
        index.read(root, found_problems)
    else:
        for r in scan.records:
            index.add(r, r["_manifest"], None)
        found_problems = list(scan.problems)
    problems = [f"manifest {p.path}{f':{p.line}' if p.line else ''}: {p.why}"
                for p in found_problems]
    traces = index.traces
    traces.sort(key=lambda r: r.start if isinstance(r.start, (int, float)) else 0)
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    notes = index.notes
    for r, wkey in zip(traces, window_keys(traces), strict=True):
        name, _region, steps, _cycle, nth = wkey
        window = found.get(wkey)
        if window is None:
            role_notes = [n for role in name.split("+") for n in notes.get(role, [])]
            window = found[wkey] = {
                "role": name, "region": r.region, "steps": list(steps),
                "cycle": r.cycle, "capture": nth, "world": r.world,
                "why": _why(r, role_notes), "traces": [], "skipped": [], "limits": [],
                "dropped": [], "other": [], "holds": [], "holders": {}}
        # Who took part, per rank (internal: --role and the ranks a window should have).
        taking_part = participants(r)
        window["holds"].extend(x for x in taking_part if x not in window["holds"])
        if isinstance(r.rank, int):
            window["holders"].setdefault(r.rank, set()).update(taking_part)
        _place(window, r, root, index)
    loose = [{"role": n.get("role"), "rank": n.get("rank"), "note": n.get("note"),
              "message": _loose(n)} for role in sorted(notes) for n in notes[role]
             if n.get("note") == "limit" or (n.get("note") == "trigger"
                                             and n.get("status") == "missed")]
    if index.notes_left_out:
        problems.append(f"the manifests hold more than {MAX_NOTES} notes: "
                        f"{index.notes_left_out} more were not read")
    return list(found.values()), problems, loose


def _loose(note: dict[str, Any]) -> str:
    if note.get("note") == "limit":
        return str(note.get("message") or "a limit was reached")
    return f"trigger request {note.get('request')} missed at step {note.get('at')}"


def _place(window: dict[str, Any], r: _Trace, root: str, index: Index) -> None:
    """One trace line into its window: a trace to read (or its summary, read later), or
    a note saying why not."""
    base = os.path.dirname(os.path.dirname(r.manifest))
    path = r.path
    full = os.path.normpath(os.path.join(base, path)) if isinstance(path, str) and path \
        else None
    rel = os.path.relpath(full, root) if full else None
    rank = r.rank
    if isinstance(r.world, int):
        window["world"] = max(window["world"] or 0, r.world)
    _identify(window.setdefault("identity", {}), r)
    why = window["why"]
    trigger = str(r.trigger or "plan")
    if (trigger, r.request) != (why["trigger"], why.get("request")):
        # a rank whose capture of these steps has another reason (bounded: the first few)
        also = why.setdefault("also", [])
        if len(also) < _ALSO:
            also.append({"rank": rank, "trigger": trigger, "request": r.request})
    limit = index.limits.get((r.manifest, str(r.capture)))
    if limit is not None and limit not in [x["why"] for x in window["limits"]]:
        window["limits"].append({"rank": rank, "why": limit})
    summary = index.summaries.get((r.manifest, path))
    if r.status == "failed" or full is None:
        window["dropped"].append({"rank": rank, "backend": r.backend,
                                  "why": r.error or "no file written"})
    elif not is_torch(r):
        window["other"].append({"rank": rank, "backend": r.backend, "path": rel})
    elif not _inside(full, root):
        # never read; its summary may still be used (the figures are in the manifest)
        if summary is not None:
            window["traces"].append(Entry(rank, rel, None, r.status, summary))
        else:
            window["skipped"].append({"rank": rank, "path": rel,
                                      "why": "outside the folder analysed: not read"})
    elif summary is not None:
        window["traces"].append(Entry(rank, rel, full, r.status, summary))
    elif not os.path.isfile(full):
        window["skipped"].append({"rank": rank, "path": rel, "why": _absent(full)})
    else:
        window["traces"].append(Entry(rank, rel, full, r.status, None))


def _identify(identity: dict[str, Any], r: _Trace) -> None:
    for key, value in zip(IDENTITY[:-1], r.identity[:-1], strict=True):
        if value is not None:
            value = _plain(value)
            seen = identity.setdefault(key, [])
            if value not in seen and len(seen) < _ALSO:
                seen.append(value)
    coords = _plain(r.identity[-1])
    if isinstance(coords, dict):  # the mesh, as far as the ranks' coordinates show it
        mesh = identity.setdefault("mesh", {})
        for dim, at in coords.items():
            if isinstance(at, int) and not isinstance(at, bool) and 0 <= at < 1 << 31:
                mesh[str(dim)] = max(mesh.get(str(dim), 0), at + 1)


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
            "why": None, "traces": [Entry(None, os.path.normpath(os.path.join(rel, n)),
                                          os.path.join(folder, n), None, None)
                                    for n in names],
            "skipped": [], "limits": [], "dropped": [], "other": []})
    return windows


__all__ = ["IDENTITY", "Entry", "Index", "describe", "from_folders", "from_manifests",
           "process_of"]
