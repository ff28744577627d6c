"""An offline plot of a memory snapshot: one self-contained HTML page, nothing fetched.

``torch.cuda.memory._dump_snapshot`` pickles a plain dict: ``segments`` (the allocator's
state at the dump) and ``device_traces`` (per device, the allocator's recent actions).
:func:`load_snapshot` reads one with an unpickler that refuses every global, so a hostile
file cannot run code; :func:`summarize` replays one device's trace into allocated and
reserved bytes over time; :func:`render_html` draws that as inline SVG (:mod:`.chart`).
Standard library only: no torch needed to read a plot.

The file is read by :mod:`.snapshot`, which bounds the work a hostile pickle can cause.

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
from array import array
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from policy_engine.backends.memory.chart import chart, human_time
from policy_engine.backends.memory.snapshot import (
    MAX_SNAPSHOT_BYTES,
    SnapshotError,
    check_snapshot,
    load_snapshot,
)
from policy_engine.errors import is_int
from policy_engine.files.publish import publish
from policy_engine.language.values.sizes import human_bytes

__all__ = ["MAX_SNAPSHOT_BYTES", "SnapshotError", "Summary", "check_snapshot",
           "load_snapshot", "render_html", "summarize", "write_plot"]
_SEGMENT_SIGN = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
_SHOWN_FRAMES = 8


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


def _int(d: dict[Any, Any], key: str) -> int | None:
    value = d.get(key)
    return value if is_int(value) else None


def _dicts(raw: object) -> list[dict[Any, Any]]:
    return [d for d in raw if isinstance(d, dict)] if isinstance(raw, list) else []


def _text(d: dict[Any, Any], key: str) -> str:
    value = d.get(key)  # anything else could be a structure too large to print
    return value if isinstance(value, str) else "?"


def _frames(raw: object) -> tuple[Frame, ...]:
    return tuple(Frame(_text(f, "filename"), _int(f, "line") or 0, _text(f, "name"))
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
               top: int = 10, title: str | None = None, force: bool = False) -> str:
    """Plot the snapshot at ``snapshot_path`` into ``out_path``, written whole or not at
    all (:func:`~policy_engine.files.publish.publish`). FileExistsError when
    ``out_path`` exists, unless ``force``. Returns ``out_path``."""
    try:
        summary = summarize(load_snapshot(snapshot_path), device, top=top)
        if _same_file(out_path, snapshot_path):
            raise SnapshotError("the page would replace the snapshot itself")
    except SnapshotError as err:
        raise SnapshotError(err.reason, snapshot_path) from None
    page = render_html(summary, title or f"Memory: {os.path.basename(snapshot_path)}")
    publish(out_path, lambda f: f.write(page.encode("utf-8")), force=force)
    return out_path


def _same_file(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        one, two = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (one.st_dev, one.st_ino) == (two.st_dev, two.st_ino)
