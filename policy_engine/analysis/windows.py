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

import json
import os
from typing import Any, Literal, NamedTuple, TypedDict, cast

from policy_engine.analysis import folders
from policy_engine.analysis.clocks import Clocks
from policy_engine.analysis.manifests import (
    LineRecord,
    ManifestProblem,
    Place,
    Scan,
    line_record,
    process_of,
    read_lines,
)
from policy_engine.analysis.spool import dumps_sorted
from policy_engine.analysis.window_roles import (
    ASCEND_SUFFIX,
    is_analysed,
    participants,
    window_keys,
)
from policy_engine.errors import is_int
from policy_engine.files.records import ABSENT, Line, Status, SummaryLine, from_json

#: Why one of a rank's traces in a window is used over the others.
USED_FIRST = "complete before partial, then the first recorded"

_ALSO = 16  # ranks listed whose capture has another trigger than the window's first
#: The notes kept from all the manifests (limits reached, trigger requests missed...);
#: past it they are counted, not kept.
MAX_NOTES = 10_000


#: A summary line as the index keeps it: where it lies (read again when its window is
#: analysed), or the line itself (from a scan that holds every record).
Source = Place | SummaryLine
#: Summary lines kept per trace (its rank writes one; a forged manifest, any number).
MAX_SUMMARY_LINES = 8


class Entry(NamedTuple):
    """One torch trace of a window: where it is (``path`` relative to the folder
    analysed; ``file`` to read, None where only its summary is kept) and its rank's
    summary lines (``summary``: one, as its rank writes them; None where there is
    none)."""

    rank: Any
    path: str | None
    file: str | None
    status: Any
    summary: Source | tuple[Source, ...] | None


# -- what a window holds ------------------------------------------------------------------

class SlowStep(TypedDict):
    """A rank's slow step behind a ``slow_step`` capture (its note in the manifest)."""

    rank: int | None
    step: Any
    seconds: float | None
    median: Any  # the rank's median step, in seconds


class OtherTrigger(TypedDict):
    """A rank whose capture of a window's steps has another trigger than the window's."""

    rank: int | None
    trigger: str
    request: str | None


class _Trigger(TypedDict):
    trigger: str  # plan, on_demand, signal, slow_step (as the trace line says)
    request: str | None  # the on-demand request's id


class WindowWhy(_Trigger, total=False):
    """Why a window's capture exists: its first trace line's trigger (:func:`_why`)."""

    slow: list[SlowStep]  # a slow_step capture's: the slow steps behind it
    also: list[OtherTrigger]  # ranks with another trigger (the first few)


class Limit(TypedDict):
    """A ``limits`` budget a capture of the window spent (its close line's ``limit``)."""

    rank: int | None
    why: str


class Dropped(TypedDict):
    """A trace line of the window with no file to read: failed, or naming none."""

    rank: int | None
    backend: Any  # as the trace line says it (unchecked)
    why: str  # its error, or "no file written"


class OtherTrace(TypedDict):
    """A trace of the window that ``analyze`` does not read (not a torch trace)."""

    rank: int | None
    backend: Any  # as the trace line says it (unchecked)
    path: str | None  # relative to the folder analysed


class Skipped(TypedDict):
    """A torch trace of the window that cannot be read, and why."""

    rank: int | None
    path: str | None  # relative to the folder analysed
    why: str


class Identity(TypedDict, total=False):
    """How a window's traces were recorded, as its ranks' trace lines say (each value as
    seen on any rank, the first few): for the comparison of two runs."""

    policy_hash: list[Any]
    policy_content_hash: list[Any]
    torch: list[Any]
    recorded: list[Any]
    mesh: dict[str, int]  # the size of each mesh dimension the ranks' coordinates show


class _Window(TypedDict):
    role: str  # its roles (``actor+ref``); a folder's path without manifests
    region: str | None
    steps: list[int | str]  # the outer steps captured (none: a whole session)
    cycle: int | None
    capture: int  # which capture of these steps (a region or rerun captured them again)
    world: int | None
    why: WindowWhy | None  # None: a folder without manifests
    traces: list[Entry]
    skipped: list[Skipped]
    limits: list[Limit]
    dropped: list[Dropped]
    other: list[OtherTrace]


class Window(_Window, total=False):
    """A capture window: every rank's trace of the same steps, made by
    :func:`from_manifests` (or :func:`from_folders`, one per folder of traces)."""

    twice: list[tuple[Entry, str]]  # a rank's other traces, and why each is left out
    holds: list[str]  # the roles taking part on any of its ranks (manifests only)
    # each rank's roles (manifests only; run.py lets go of it once read)
    holders: dict[int, tuple[str, ...]]
    identity: Identity  # how it was recorded (manifests only)
    not_analysed: str  # why it is not analysed (run.analyze_run: over --max-traces)
    # internal to the grouping (from_manifests), gone once it is done: the roles of the
    # rank placed last, and the identities seen
    _last: tuple[str, ...]
    identities: set[tuple[Any, ...]]


class LooseNote(TypedDict):
    """A note of the manifests that belongs to no window: a ``limits`` budget spent, a
    trigger request missed (:func:`from_manifests`)."""

    role: str | None
    rank: int | None
    note: str | None
    message: str


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
    #: its process's summary lines of it, and the limit its capture's close line names
    #: (set when the process's lines are all read: :meth:`Index.add`)
    summary: Any = None
    limit: Any = None

    def get(self, key: str, default: Any = None) -> Any:
        value = getattr(self, key, default)
        return default if value is None else value


def describe(window: Window) -> str:
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


def _why(first: _Trace, notes: list[LineRecord]) -> WindowWhy:
    """The trigger of a window's capture, with its request or the slow step behind it."""
    trigger = str(first.trigger or "plan")
    why: WindowWhy = {"trigger": trigger, "request": first.request}
    if trigger == "slow_step":
        steps = set(first.steps or ())
        slow = [n for n in notes if n.get("note") == "slow_step"
                and steps & _ints(n.get("captures"))]
        why["slow"] = [{"rank": n.get("rank"), "step": n.get("step"),
                        "seconds": n.get("seconds"), "median": n.get("median")}
                       for n in sorted(slow, key=lambda n: str(n.get("rank")))]
    return why


def _ints(value: Any) -> set[int]:
    """The integers of a list read from a manifest (anything else: none)."""
    if not isinstance(value, list):
        return set()
    return {v for v in value if isinstance(v, int)}


# The keys of IDENTITY a window's identity lists as they are (the coordinates, last, give
# its mesh).
_RECORDED: tuple[Literal["policy_hash", "policy_content_hash", "torch", "recorded"], ...] = (
    "policy_hash", "policy_content_hash", "torch", "recorded")
#: What a trace line says of how it was recorded, gathered per window for the comparison
#: of two runs (each value as seen on any rank: a window normally has one of each).
IDENTITY = (*_RECORDED, "coords")


def _json_key(value: Any) -> Any:
    """A JSON value as a hashable key: itself, or a list or object as its JSON text."""
    if isinstance(value, (list, dict)):
        return ("json", dumps_sorted(value))
    return value


def _from_key(key: Any) -> Any:
    """:func:`_json_key` undone: the JSON value again."""
    if isinstance(key, tuple) and key[:1] == ("json",):
        return json.loads(key[1])
    return key


class _Shared:
    """Values seen before, handed out again: 100,000 ranks' lines name the same roles,
    steps and policy, and hold them once. Lists come back as tuples."""

    def __init__(self) -> None:
        self._seen: dict[Any, Any] = {}

    def __call__(self, value: Any) -> Any:
        if isinstance(value, list):
            try:
                value = tuple(value)
                return self._seen.setdefault(value, value)
            except TypeError:  # a list of objects, from a damaged line: not shared
                return value
        if isinstance(value, dict):
            return value
        return self._seen.setdefault(value, value)

    def key(self, value: Any) -> Any:
        """``value`` as a shared hashable key (:func:`_json_key`)."""
        key = _json_key(value)
        return self._seen.setdefault(key, key)


def _compact(line: Line, manifest: str, share: _Shared) -> _Trace:
    more = line.more
    return _Trace(
        manifest=manifest, capture=_get(line.capture), role=share(_get(line.role)),
        roles=share(_get(line.roles)), joined=share(_get(line.joined)),
        region=share(_get(line.region)), steps=share(_get(line.steps)),
        cycle=_get(line.cycle), rank=_get(line.rank), world=_get(line.world),
        backend=share(more.get("backend")), path=_get(line.path),
        status=share(_get(getattr(line, "status", None))), error=_get(line.error),
        start=_get(line.start),
        trigger=share(_get(line.trigger)), request=_get(line.request),
        identity=share(tuple(share.key(more.get(k) if k != "coords" else _get(line.coords))
                             for k in IDENTITY)))


def _get(value: Any) -> Any:
    return None if value is ABSENT else value


class Index:
    """What the windows need of the manifests, gathered a line at a time. A process's
    lines come together (its files, in order): its summary lines and its captures' limits
    are joined to its trace lines when its last line is read, and let go, so that what
    is held between lines does not grow with the processes."""

    def __init__(self, *, from_traces: bool) -> None:
        self.from_traces = from_traces
        self.share = _Shared()
        self.traces: list[_Trace] = []
        self.process: str | None = None  # whose lines are being read
        self.first = 0  # where its trace lines begin in ``traces``
        self.limits: dict[str, str] = {}  # its close lines' limits, by capture
        self.summaries: dict[Any, Source | tuple[Source, ...]] = {}  # its, by path
        self.notes: dict[str, list[LineRecord]] = {}
        self.notes_left_out = 0
        self.notes_kept = 0
        self.folders: dict[str, str] = {}
        self.problems: list[ManifestProblem] = []
        self.clocks = Clocks()  # the ranks' clock readings (``clock`` notes), kept apart

    def add(self, line: Line, manifest: str, place: Place | None) -> None:
        """One line of the manifest ``manifest`` (``place``: where it lies)."""
        if manifest != self.process:
            self.end_process()
            self.process, self.first = manifest, len(self.traces)
        if line.EVENT == "trace":
            self.traces.append(_compact(line, manifest, self.share))
        elif isinstance(line, SummaryLine):
            if self.from_traces:
                return
            key = line.path
            source: Source = place if place is not None else line
            found = self.summaries.get(key)
            if found is None:
                self.summaries[key] = source
            elif not isinstance(found, tuple):
                self.summaries[key] = (found, source)
            elif len(found) < MAX_SUMMARY_LINES:
                self.summaries[key] = (*found, source)
        elif line.EVENT == "close":
            limit = line.more.get("limit")
            if isinstance(limit, str):
                self.limits[str(line.capture)] = limit
        elif line.EVENT == "note":
            if line.note == "clock":
                self.clocks.add(line)
            elif self.notes_kept < MAX_NOTES:
                self.notes_kept += 1
                self.notes.setdefault(str(_get(line.role)), []).append(line_record(line))
            else:
                self.notes_left_out += 1

    def end_process(self) -> None:
        """The process whose lines were read is done: its trace lines get its summary
        lines and limits."""
        summaries, limits = self.summaries, self.limits
        if summaries or limits:
            traces = self.traces
            for i in range(self.first, len(traces)):
                t = traces[i]
                found, limit = summaries.get(t.path), limits.get(str(t.capture))
                if found is not None or limit is not None:
                    traces[i] = t._replace(summary=found, limit=limit)
        self.summaries, self.limits = {}, {}

    def release(self) -> None:
        """Let go of what the windows were made from (an index is read once)."""
        self.traces = []
        self.folders = {}
        self.share = _Shared()

    def folder_of(self, manifest: str, root: str) -> str:
        """The output folder of the manifest ``manifest``, relative to ``root``."""
        folder = os.path.dirname(manifest)  # a run's processes share a few folders
        found = self.folders.get(folder)
        if found is None:
            found = self.folders[folder] = os.path.relpath(os.path.dirname(folder), root)
        return found

    def read(self, root: str) -> None:
        """Every line of the manifests under ``root`` (their problems in
        :attr:`problems`)."""
        for found in read_lines(root, self.problems, wanted=_not_open, heads=True):
            self.add(found.line, found.manifest, found.place)


#: An open line, as the writer spells its kind. Those quotes cannot stand unescaped inside
#: a string, so only a line whose object holds that key and value has these bytes: an
#: open line (or a forged one, which is then left out like any open line).
_OPEN = b'"event": "open"'


def _not_open(raw: bytes) -> bool:
    """Whether a line may be anything but an open line (the windows need none)."""
    return _OPEN not in raw


def read_index(root: str, *, from_traces: bool = False, scan: Scan | None = None) -> Index:
    """What the windows need of the manifests under ``root`` (from ``scan`` when the
    caller read them already)."""
    index = Index(from_traces=from_traces)
    if scan is None:
        index.read(root)
    else:
        for r in scan.records:
            index.add(from_json({k: v for k, v in r.items() if not k.startswith("_")}),
                      r["_manifest"], None)
        index.problems = list(scan.problems)
    index.end_process()
    return index


def from_manifests(root: str, *, from_traces: bool = False, scan: Scan | None = None,
                   index: Index | None = None
                   ) -> tuple[list[Window], list[str], list[LooseNote]]:
    """The windows under ``root`` (oldest first), problems with the manifests, and notes
    that belong to no window (a ``limits`` budget spent, a trigger request missed). A
    trace whose rank wrote its summary to the manifest carries it (``summary``: where the
    line lies, or the figures themselves when ``scan`` holds them) and is not read again,
    unless ``from_traces``; ``scan`` or ``index``: the manifests, already read."""
    if index is None:
        index = read_index(root, from_traces=from_traces, scan=scan)
    index.end_process()
    problems = [f"manifest {p.path}{f':{p.line}' if p.line else ''}: {p.why}"
                for p in index.problems]
    traces: list[_Trace] = index.traces
    traces.sort(key=lambda r: r.start if isinstance(r.start, (int, float)) else 0)
    found: dict[tuple[Any, ...], Window] = {}
    notes = index.notes
    for t, wkey in zip(traces, window_keys(traces), strict=True):
        name, _region, steps, _cycle, nth = wkey
        window = found.get(wkey)
        if window is None:
            role_notes = [n for role in name.split("+") for n in notes.get(role, [])]
            window = found[wkey] = {
                "role": name, "region": t.region, "steps": list(steps),
                "cycle": t.cycle, "capture": nth, "world": t.world,
                "why": _why(t, role_notes), "traces": [], "skipped": [], "limits": [],
                "dropped": [], "other": [], "holds": [], "holders": {}}
        # Who took part, per rank (internal: --role and the ranks a window should have).
        taking_part = index.share(participants(t))
        if taking_part is not window.get("_last"):  # as the rank before's, nearly always
            window["_last"] = taking_part
            window["holds"].extend(x for x in taking_part if x not in window["holds"])
        if isinstance(t.rank, int):
            held = window["holders"].get(t.rank)
            if held is None:
                window["holders"][t.rank] = taking_part  # shared: made a set when joined
            elif held is not taking_part:
                window["holders"][t.rank] = index.share(tuple(dict.fromkeys(
                    (*held, *taking_part))))
        _place(window, t, root, index)
    loose: list[LooseNote] = [
        {"role": n.get("role"), "rank": n.get("rank"), "note": n.get("note"),
         "message": _loose(n)} for role in sorted(notes) for n in notes[role]
        if n.get("note") == "limit" or (n.get("note") == "trigger"
                                        and n.get("status") == "missed")]
    if index.notes_left_out:
        problems.append(f"the manifests hold more than {MAX_NOTES} notes: "
                        f"{index.notes_left_out} more were not read")
    del traces
    index.release()  # what it gathered is in the windows now (a caller may still hold it)
    for window in found.values():
        window.pop("_last", None)
        window.pop("identities", None)
        window["twice"] = _one_per_rank(window)
    return list(found.values()), problems, loose


def _one_per_rank(window: Window) -> list[tuple[Entry, str]]:
    """A rank with several traces in the window (two trace lines name it) keeps one: a
    complete one rather than a partial one, else the first recorded. The others leave
    ``traces``; returned, each with what the window's readiness says of it."""
    seen: set[int] = set()
    twice: set[int] = set()
    for e in window["traces"]:
        if isinstance(e.rank, int):
            if e.rank in seen:
                twice.add(e.rank)
            seen.add(e.rank)
    if not twice:
        return []
    by_rank: dict[int, list[Entry]] = {}
    kept: list[Entry] = []
    for e in window["traces"]:
        if e.rank in twice:
            by_rank.setdefault(e.rank, []).append(e)
        else:
            kept.append(e)
    out = []
    for rank, entries in by_rank.items():
        used, *rest = sorted(entries, key=lambda e: e.status not in (None, Status.COMPLETE))
        kept.append(used)
        for e in rest:
            out.append((e, f"rank {rank} has {len(entries)} traces in this window: "
                           f"{used.path} is used ({USED_FIRST}); {e.path} is left out of "
                           "every figure"))
    window["traces"] = kept
    return out


def _loose(note: LineRecord) -> str:
    if note.get("note") == "limit":
        return str(note.get("message") or "a limit was reached")
    return f"trigger request {note.get('request')} missed at step {note.get('at')}"


def _place(window: Window, r: _Trace, root: str, index: Index) -> None:
    """One trace line into its window: a trace to read (or its summary, read later), or
    a note saying why not."""
    path = r.path
    rel = os.path.normpath(os.path.join(index.folder_of(r.manifest, root), path)) \
        if isinstance(path, str) and path else None
    if rel == path:
        rel = path  # the line's own string, held once
    full = os.path.join(root, rel) if rel is not None else None
    rank = r.rank
    if isinstance(r.world, int):
        window["world"] = max(window["world"] or 0, r.world)
    if r.identity not in window.setdefault("identities", set()):  # not as another rank's
        window["identities"].add(r.identity)
        _identify(window.setdefault("identity", {}), r)
    # a window of the manifests has its first trace line's trigger (from_manifests)
    why = cast(WindowWhy, window["why"])
    trigger = str(r.trigger or "plan")
    if (trigger, r.request) != (why["trigger"], why.get("request")):
        # a rank whose capture of these steps has another reason (bounded: the first few)
        also = why.setdefault("also", [])
        if len(also) < _ALSO:
            also.append({"rank": rank, "trigger": trigger, "request": r.request})
    limit = r.limit
    if limit is not None and limit not in [x["why"] for x in window["limits"]]:
        window["limits"].append({"rank": rank, "why": limit})
    summary = r.summary
    if r.status == Status.FAILED or full is None:
        window["dropped"].append({"rank": rank, "backend": r.backend,
                                  "why": r.error or "no file written"})
    elif not is_analysed(r):
        window["other"].append({"rank": rank, "backend": r.backend, "path": rel})
    elif summary is not None:  # the trace is read only if the summary cannot be used
        window["traces"].append(Entry(rank, rel, None, r.status, summary))
    elif not inside(full, root):
        window["skipped"].append({"rank": rank, "path": rel,
                                  "why": "outside the folder analysed: not read"})
    elif not readable(full):
        window["skipped"].append({"rank": rank, "path": rel, "why": absent(full)})
    else:
        window["traces"].append(Entry(rank, rel, full, r.status, None))


def _identify(identity: Identity, r: _Trace) -> None:
    for key, value in zip(_RECORDED, r.identity[:-1], strict=True):
        if value is not None:
            value = _from_key(value)
            seen = identity.setdefault(key, [])
            if value not in seen and len(seen) < _ALSO:
                seen.append(value)
    coords = _from_key(r.identity[-1])
    if isinstance(coords, dict):  # the mesh, as far as the ranks' coordinates show it
        mesh = identity.setdefault("mesh", {})
        for dim, at in coords.items():
            if is_int(at) and 0 <= at < 1 << 31:
                mesh[str(dim)] = max(mesh.get(str(dim), 0), at + 1)


def absent(path: str) -> str:
    """Why a trace the manifest names cannot be read as one: not there, or not a file
    (an Ascend capture: not a folder)."""
    if not os.path.lexists(path):
        return "missing: the manifest names it, but it is not on disk"
    if path.endswith(ASCEND_SUFFIX):
        return "not a folder (an Ascend capture is torch_npu's folder)"
    return "not a regular file (a folder, a FIFO or a device where the trace should be)"


def readable(path: str) -> bool:
    """Whether the trace at ``path`` is there to read: a regular file, or an Ascend
    capture's folder."""
    return os.path.isdir(path) if path.endswith(ASCEND_SUFFIX) else os.path.isfile(path)


def inside(path: str, root: str) -> bool:
    """Whether ``path`` (links resolved) lies under ``root``: a manifest is untrusted, and
    a trace it names elsewhere is not read."""
    top = os.path.realpath(root)
    return os.path.commonpath([top, os.path.realpath(path)]) == top


def from_folders(root: str) -> tuple[list[Window], list[str]]:
    """Without manifests: each folder holding traces is one window, whatever its files
    are named (:mod:`~policy_engine.analysis.folders`); and notes on the files passed
    over."""
    found, notes = folders.from_folders(
        root, lambda rank, rel, full: Entry(rank, rel, full, None, None))
    return [{"role": name, "region": None, "steps": [], "cycle": None, "capture": 1,
             "world": None, "why": None, "traces": traces, "skipped": [], "limits": [],
             "dropped": [], "other": [], "twice": []} for name, traces in found], notes


__all__ = ["IDENTITY", "Entry", "Index", "describe", "from_folders", "from_manifests",
           "process_of", "read_index"]
