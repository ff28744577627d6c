"""An offline plot of a memory snapshot: one self-contained HTML page, nothing fetched.

``torch.cuda.memory._dump_snapshot`` pickles a plain dict: ``segments`` (the allocator's
state at the dump) and ``device_traces`` (per device, the allocator's recent actions).
:func:`load_snapshot` reads one with an unpickler that refuses every global, so a hostile
file cannot run code; :func:`summarize` replays one device's trace into allocated and
reserved bytes over time; :func:`render_html` draws that as inline SVG (:mod:`.chart`).
Standard library only: no torch needed to read a plot.

A trace can begin mid-run: history turned on after allocations were made, or its oldest
entries dropped (``max_entries``). Replayed from zero, its levels would be too low and
could go negative. So the replay starts from what was live before the first entry: the
allocations the trace frees without having seen them made (sizes from the free entries,
no stacks), plus the blocks still allocated at the dump that the trace never allocates or
frees (with their stacks, where recorded). Reserved bytes start at the dump's segment
total less what the trace's segment entries add up to (never below zero).
"""

from __future__ import annotations

import html
import os
import pickle
import tempfile
from array import array
from dataclasses import dataclass, field
from typing import Any, NamedTuple, NoReturn

from policy_engine.backends.memory.chart import chart, human_bytes, human_time

#: Larger files are refused rather than read into memory.
MAX_SNAPSHOT_BYTES = 2 << 30
_SEGMENT_SIGN = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
_SHOWN_FRAMES = 8


class SnapshotError(ValueError):
    """Not a readable memory snapshot, or no such device in it."""

    def __init__(self, reason: str, path: str | None = None) -> None:
        super().__init__(reason if path is None else f"{path}: {reason}")
        self.reason, self.path = reason, path


class Frame(NamedTuple):
    filename: str
    line: int
    name: str


class Allocation(NamedTuple):
    address: int
    size: int
    time: int | None  # as Summary.times; None: allocated before the trace began
    frames: tuple[Frame, ...]  # innermost first


class Oom(NamedTuple):
    time: int
    size: int  # bytes asked for
    device_free: int | None


@dataclass(frozen=True)
class Summary:
    """One device's history. ``times``: the entries' ``time_us`` when all have one
    (``time_unit`` "us"), else their positions ("event"). Point 0 is the level before the
    first entry (or at the dump, with no trace); later points follow changes."""

    device: int
    devices: tuple[int, ...]  # every device with a trace or segments
    events: int  # trace entries of this device
    time_unit: str
    times: array[int] = field(repr=False)
    allocated: array[int] = field(repr=False)
    reserved: array[int] = field(repr=False)
    peak_allocated: int
    peak_time: int  # when allocated first reached its peak
    peak_reserved: int  # reserved bytes at that moment
    largest: tuple[Allocation, ...]  # live at the peak, largest first
    ooms: tuple[Oom, ...]
    notes: tuple[str, ...]


class _DataOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> NoReturn:
        raise pickle.UnpicklingError(f"it asks for {module}.{name}; a snapshot is plain data")


def check_snapshot(data: object) -> dict[str, Any]:
    """``data`` if it has the shape of a snapshot dict, else SnapshotError."""
    if not isinstance(data, dict):
        raise SnapshotError(f"the pickle holds a {type(data).__name__}, not a snapshot dict")
    for key in ("segments", "device_traces"):
        if key not in data:
            raise SnapshotError(f"no {key!r} key: not a torch.cuda.memory._dump_snapshot file")
        if not isinstance(data[key], list):
            raise SnapshotError(f"{key!r} is a {type(data[key]).__name__}, not a list")
    if not all(isinstance(trace, list) for trace in data["device_traces"]):
        raise SnapshotError("'device_traces' holds something other than lists of entries")
    return data


def load_snapshot(path: str, *, max_bytes: int = MAX_SNAPSHOT_BYTES) -> dict[str, Any]:
    """The snapshot dict pickled at ``path``. SnapshotError, naming ``path``, when the file
    is unreadable, not a regular file, empty, too large, truncated or not a snapshot."""
    try:
        if os.path.exists(path) and not os.path.isfile(path):
            raise SnapshotError("not a regular file")
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise SnapshotError(f"{human_bytes(size)} is more than the "
                                    f"{human_bytes(max_bytes)} this reads")
            if size == 0:
                raise SnapshotError("empty file")
            try:
                data = _DataOnly(f).load()
            except Exception as err:  # malformed input raises all sorts; no code ran
                text = str(err) or type(err).__name__
                if isinstance(err, EOFError) or "truncated" in text:
                    raise SnapshotError("truncated: the pickle ends early") from None
                raise SnapshotError(f"not a memory snapshot pickle ({text})") from None
        return check_snapshot(data)
    except SnapshotError as err:
        raise SnapshotError(err.reason, path) from None
    except OSError as err:
        raise SnapshotError(f"cannot read: {err.strerror or err}", path) from None


def _int(d: dict[Any, Any], key: str) -> int | None:
    value = d.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _dicts(raw: object) -> list[dict[Any, Any]]:
    return [d for d in raw if isinstance(d, dict)] if isinstance(raw, list) else []


def _frames(raw: object) -> tuple[Frame, ...]:
    return tuple(Frame(str(f.get("filename", "?")), _int(f, "line") or 0, str(f.get("name", "?")))
                 for f in _dicts(raw))


def _pick_device(traces: list[Any], segments: list[Any], device: int | None) -> tuple[
        int, tuple[int, ...]]:
    counts = {i: len(t) for i, t in enumerate(traces) if t}
    devices = tuple(sorted(set(counts).union(
        s.get("device", 0) for s in _dicts(segments) if isinstance(s.get("device", 0), int))))
    if device is not None and device not in devices:
        have = ", ".join(map(str, devices)) or "none"
        raise SnapshotError(f"no device {device} in this snapshot (devices with data: {have})")
    if device is None:
        device = max(counts, key=lambda d: (counts[d], -d)) if counts else (devices or (0,))[0]
    return device, devices


def _dump_state(segments: list[Any], device: int, states: set[str]) -> tuple[
        dict[int, Allocation], int]:
    """The blocks in ``states`` at the dump, by address, and the bytes reserved then."""
    ours = [seg for seg in _dicts(segments) if seg.get("device", 0) == device]
    blocks = {b["address"]: Allocation(b["address"], b["size"], None, _frames(b.get("frames")))
              for seg in ours for b in _dicts(seg.get("blocks")) if b.get("state") in states
              and _int(b, "address") is not None and _int(b, "size") is not None}
    return blocks, sum(_int(seg, "total_size") or 0 for seg in ours)


#: (times, allocated, reserved, whether times are time_us rather than positions)
_Series = tuple["array[int]", "array[int]", "array[int]", bool]


def _when(entry: dict[str, Any], index: int, series: _Series) -> int:
    return (_int(entry, "time_us") or 0) if series[3] else index


def _replay(entries: list[dict[str, Any]], live: dict[int, int], origin: dict[int, int],
            free: str, levels: tuple[int, int], stop: int, series: _Series | None = None
            ) -> tuple[int, int]:
    """Apply ``entries[:stop]`` to ``live`` (address -> size) and ``origin`` (address ->
    position of its alloc), appending a point per change to ``series`` if given. Returns
    the peak of allocated bytes and the position of the entry that first reached it."""
    allocated, reserved = levels
    peak, peak_at = allocated, -1
    for i in range(stop):
        e = entries[i]
        action, addr, size = e["action"], _int(e, "addr"), _int(e, "size")
        if addr is None or size is None:
            continue
        if action == "alloc":
            allocated += size - live.get(addr, 0)  # an address reused without a free seen
            live[addr], origin[addr] = size, i
        elif action == free:
            allocated -= live.pop(addr, size)
            origin.pop(addr, None)
        elif action in _SEGMENT_SIGN:
            reserved += _SEGMENT_SIGN[action] * size
        else:
            continue
        if series is not None:
            series[0].append(_when(e, i, series))
            series[1].append(allocated)
            series[2].append(reserved)
        if allocated > peak:
            peak, peak_at = allocated, i
    return peak, peak_at


def summarize(snapshot: dict[str, Any], device: int | None = None, *, top: int = 10) -> Summary:
    """Replay ``device``'s trace (by default the device with the most entries) into
    allocated bytes (alloc adds, free_completed subtracts) and reserved bytes (segment
    alloc and map add, free and unmap subtract); find the peak and the ``top`` largest
    allocations live at it. SnapshotError when there is no such device."""
    traces, segments = check_snapshot(snapshot)["device_traces"], snapshot["segments"]
    device, devices = _pick_device(traces, segments, device)
    raw = traces[device] if device < len(traces) else []
    entries = [e for e in _dicts(raw) if isinstance(e.get("action"), str)]
    notes = []
    if len(entries) < len(raw):
        notes.append(f"left out {len(raw) - len(entries)} unreadable trace entries")
    actions = {e["action"] for e in entries}
    free = "free_completed"
    if "free_requested" in actions and "free_completed" not in actions:
        free = "free_requested"  # recorded with skip_actions=["free_completed"]
    series: _Series = (array("q"), array("q"), array("q"),
                       bool(entries) and all(_int(e, "time_us") is not None for e in entries))
    # Blocks awaiting a free_completed are still allocated, as the replay counts them.
    blocks, dump_reserved = _dump_state(segments, device, {"active_allocated"} | (
        {"active_awaiting_free"} if free == "free_completed" else set()))

    first: dict[int, dict[str, Any]] = {}  # each address's first alloc or free
    for e in entries:
        if e["action"] in ("alloc", free) and _int(e, "addr") is not None:
            first.setdefault(e["addr"], e)
    seeded = {a: Allocation(a, _int(e, "size") or 0, None, ())
              for a, e in first.items() if e["action"] == free}
    seeded.update((a, b) for a, b in blocks.items() if a not in first)
    added = sum(_SEGMENT_SIGN[e["action"]] * (_int(e, "size") or 0)
                for e in entries if e["action"] in _SEGMENT_SIGN)
    start = (sum(a.size for a in seeded.values()), max(0, dump_reserved - added))
    if entries and any(start):
        notes.append("the trace begins mid-run: the levels before its first entry come from "
                     "the allocations it frees unseen and from the dump's segments")
    elif not entries:
        notes.append("no allocator history for this device: this is the state at the dump "
                     "(record it with torch.cuda.memory._record_memory_history)")
    series[0].append(_when(entries[0], 0, series) if entries else 0)
    series[1].append(start[0])
    series[2].append(start[1])
    peak, peak_at = _replay(entries, {a: s.size for a, s in seeded.items()}, {}, free,
                            start, len(entries), series)
    end = _when(entries[-1], len(entries) - 1, series) if entries else series[0][-1]
    if end != series[0][-1]:  # the levels hold until the trace's last entry
        series[0].append(end)
        series[1].append(series[1][-1])
        series[2].append(series[2][-1])
    # Again up to the peak: what was live then, and which entry allocated it.
    live, origin = {a: s.size for a, s in seeded.items()}, dict[int, int]()
    _replay(entries, live, origin, free, start, peak_at + 1)
    largest = tuple(
        Allocation(a, size, _when(entries[origin[a]], origin[a], series),
                   _frames(entries[origin[a]].get("frames"))) if a in origin else seeded[a]
        for a, size in sorted(live.items(), key=lambda kv: (-kv[1], kv[0]))[:max(top, 0)])
    at = series[1].index(peak)
    return Summary(
        device=device, devices=devices, events=len(raw),
        time_unit="us" if series[3] else "event", times=series[0], allocated=series[1],
        reserved=series[2], peak_allocated=peak, peak_time=series[0][at],
        peak_reserved=series[2][at], largest=largest, notes=tuple(notes),
        ooms=tuple(Oom(_when(e, i, series), _int(e, "size") or 0, _int(e, "device_free"))
                   for i, e in enumerate(entries) if e["action"] == "oom"))


def _internal(f: Frame) -> bool:
    """A frame of torch itself, the interpreter or C/C++: noise in "who allocated this"."""
    path = f.filename.replace("\\", "/")
    return ("-packages/torch/" in path or "-packages/torch_npu/" in path
            or path.startswith("<frozen") or path in ("", "?", "??")
            or path.endswith((".c", ".cc", ".cpp", ".cu", ".h", ".hpp"))
            or f.name.startswith(("PyEval_", "_PyEval", "PyObject_", "_PyObject")))


def _stack(frames: tuple[Frame, ...]) -> str:
    if not frames:
        return '<span class="note">no stack recorded</span>'
    shown = [f for f in frames if not _internal(f)] or list(frames)  # never hide them all
    lines = [html.escape(f"{f.name}  {f.filename}:{f.line}") for f in shown[:_SHOWN_FRAMES]]
    if len(frames) > len(lines):
        lines.append(f'<span class="note">({len(frames) - len(lines)} more: torch '
                     "internals, the interpreter, or further out)</span>")
    return "<pre>" + "\n".join(lines) + "</pre>"


def render_html(summary: Summary, title: str) -> str:
    """One self-contained page: inline SVG and CSS, no script, nothing fetched."""
    s, t0 = summary, min(summary.times)

    def when(t: int | None) -> str:
        if t is None or not s.events:
            return "before the trace" if s.events else "at the dump"
        return human_time(t - t0) if s.time_unit == "us" else f"entry {t}"

    facts = [f"device {s.device}" + (f" of {', '.join(map(str, s.devices))}"
                                     if len(s.devices) > 1 else ""), f"{s.events} trace entries",
             f"peak allocated {human_bytes(s.peak_allocated)} at {when(s.peak_time)}, "
             f"with {human_bytes(s.peak_reserved)} reserved",
             f"most reserved {human_bytes(max(s.reserved))}"]
    facts += [f"out of memory {len(s.ooms)} time(s)"] if s.ooms else []
    rows = "\n".join(
        f'<tr><td class="n">{k}</td><td class="n">{human_bytes(a.size)}</td>'
        f'<td class="n">0x{a.address:x}</td><td class="n">{when(a.time)}</td>'
        f"<td>{_stack(a.frames)}</td></tr>" for k, a in enumerate(s.largest, 1))
    notes = "".join(f'\n<p class="note">{html.escape(n)}</p>' for n in s.notes)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"/><title>{html.escape(title)}</title>
<style>
body{{font:14px/1.4 sans-serif;margin:24px;color:#222}} table{{border-collapse:collapse}}
th,td{{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}}
td.n{{text-align:right;white-space:nowrap}} .note{{color:#666}}
pre{{margin:0;font:12px/1.35 monospace;white-space:pre-wrap}}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p>{html.escape("; ".join(facts))}</p>{notes}
{chart(s.times, s.allocated, s.reserved, in_us=s.time_unit == "us",
      peak=(s.peak_time, s.peak_allocated), ooms=s.ooms)}
<h2>Largest allocations live at the peak</h2>
<table><tr><th>#</th><th>size</th><th>address</th><th>allocated</th>
<th>stack, innermost first</th></tr>
{rows}
</table></body></html>
"""


def write_plot(snapshot_path: str, out_path: str, *, device: int | None = None,
               top: int = 10, title: str | None = None) -> str:
    """Plot the snapshot at ``snapshot_path`` into ``out_path``, written whole or not at
    all (a temporary file, then a rename). Returns ``out_path``."""
    try:
        summary = summarize(load_snapshot(snapshot_path), device, top=top)
        if os.path.realpath(out_path) == os.path.realpath(snapshot_path):
            raise SnapshotError("the page would replace the snapshot itself")
    except SnapshotError as err:
        raise SnapshotError(err.reason, snapshot_path) from None
    page = render_html(summary, title or f"Memory: {os.path.basename(snapshot_path)}")
    fd, temp = tempfile.mkstemp(prefix=".memory-plot-", suffix=".tmp",
                                dir=os.path.dirname(os.path.abspath(out_path)))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(page)
        os.chmod(temp, 0o644)
        os.replace(temp, out_path)
    except BaseException:
        os.unlink(temp)
        raise
    return out_path
