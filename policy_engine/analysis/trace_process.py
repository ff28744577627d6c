"""The events of one input trace rewritten as one process of a merged trace.

Every table :class:`ProcessMap` keeps grows with the input (a thread per ``(pid, tid)``
pair, a name per process), and the input is untrusted: past :data:`MAX_THREADS` entries
it refuses the trace rather than hold millions of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, Literal, TypedDict

from policy_engine.analysis.chrome_trace import TraceError, TraceEvent
from policy_engine.errors import is_int

#: The most threads (distinct pid and tid pairs) and processes one input trace may have;
#: a torch trace has tens.
MAX_THREADS = 65536


#: Phases whose ``id`` ties events together (flows, async slices, objects).
_ID_PHASES = frozenset("stfbenSTpFNOD")
_ProcessMeta = Literal["process_name", "process_labels", "process_sort_index"]
_ThreadMeta = Literal["thread_name", "thread_sort_index"]
#: The metadata events that name and place processes and threads: the arg each gives.
_PROCESS_META: dict[_ProcessMeta, str] = {
    "process_name": "name", "process_labels": "labels", "process_sort_index": "sort_index"}
_THREAD_META: dict[_ThreadMeta, str] = {"thread_name": "name",
                                        "thread_sort_index": "sort_index"}


class _ProcessNames(TypedDict, total=False):
    """An input process's names as its metadata events give them, held back by ``event``."""

    # the arg each event gives (untrusted): ``metadata`` names and orders threads by them

    process_name: Any
    process_labels: Any
    process_sort_index: Any


class _ThreadNames(TypedDict, total=False):
    """An input thread's name and place as its metadata events give them, held back."""

    thread_name: Any
    thread_sort_index: Any


class _MetadataKeys(TypedDict):
    """The keys every :class:`MetadataEvent` has."""

    ph: str  # "M"
    name: str  # process_name, process_sort_index, process_labels, thread_name...
    pid: int
    # {"name": ...}, {"sort_index": ...} or {"labels": ...}; a process's name also
    # carries the description its caller gives (merge.py: rank, role, trace...)
    args: Mapping[str, Any]


class MetadataEvent(_MetadataKeys, total=False):
    """A metadata event naming or placing the merged process or a thread, from ``metadata``."""

    tid: int  # a thread's (absent: the process's)


def _key(value: Any) -> Any:
    """A pid or tid as a dictionary key (JSON lets them be anything)."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    return json.dumps(value, sort_keys=True)


def _number(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return float("inf")


def _named(value: Any, kind: str, ident: Any) -> str:
    """A process's or thread's name: its own, else its id (torch uses names as ids)."""
    if isinstance(value, str) and value:
        return value
    if isinstance(ident, str) or ident is None:
        return ident or ""
    return f"{kind} {ident}"


class ProcessMap:
    """The events of one input trace as the one process ``pid`` of a merged trace.

    - each (pid, tid) of the input becomes a thread whose id comes from ``tids``, shared
      by every input, so no two threads of the merged trace share an id (Perfetto names
      threads by tid alone);
    - ``ts`` moves by ``shift`` microseconds;
    - ids that pair events (flows, async slices) move by ``id_base``, so pairs never
      cross inputs; global instants become instants of this process;
    - the input's process and thread names are held back: ``metadata()`` writes them,
      the threads of the main process (``main``, else the first pid seen) under their
      own names, the others after their process's name (``GPU 0 stream 7``).
    """

    def __init__(self, pid: int, *, shift: float, id_base: int, tids: Iterator[int],
                 main: Any = None) -> None:
        self.pid = pid
        self._shift = shift
        self._id_base = id_base
        self._tids = tids
        self._main = main
        self._threads: dict[tuple[Any, Any], int] = {}
        self._procs: dict[Any, _ProcessNames] = {}
        self._names: dict[int, _ThreadNames] = {}

    def event(self, event: TraceEvent) -> TraceEvent | None:
        """``event`` rewritten in place, or None for a name held back."""
        pid = _key(event.get("pid"))
        if self._main is None and pid is not None:
            self._main = pid
        ph = event.get("ph")
        ph = ph if isinstance(ph, str) else None
        if ph == "M":
            name, args = event.get("name"), event.get("args")
            args = args if isinstance(args, dict) else {}
            if isinstance(name, str) and name in _PROCESS_META:
                if pid not in self._procs and len(self._procs) >= MAX_THREADS:
                    raise TraceError(f"more than {MAX_THREADS} processes named: too many "
                                     "to merge")
                self._procs.setdefault(pid, {})[name] = args.get(_PROCESS_META[name])
                return None
            if isinstance(name, str) and name in _THREAD_META:
                tid = self._tid(pid, event.get("tid"))
                self._names.setdefault(tid, {})[name] = args.get(_THREAD_META[name])
                return None
        event["pid"] = self.pid
        event["tid"] = self._tid(pid, event.get("tid"))
        ts = event.get("ts")
        if self._shift and isinstance(ts, (int, float)) and not isinstance(ts, bool):
            try:
                event["ts"] = ts + self._shift
            except OverflowError:  # an integer past a float's range moved by a fraction
                raise TraceError(f"a timestamp of {len(str(abs(ts)))} digits: no time") \
                    from None
        if self._id_base:
            if ph in _ID_PHASES and "id" in event:
                event["id"] = self._id(event["id"])
            if "bind_id" in event:
                event["bind_id"] = self._id(event["bind_id"])
            id2 = event.get("id2")
            if isinstance(id2, dict) and "global" in id2:
                id2["global"] = self._id(id2["global"])
        if ph in ("i", "I", "R") and event.get("s") == "g":
            event["s"] = "p"
        return event

    def _tid(self, pid: Any, tid: Any) -> int:
        key = (pid, _key(tid))
        new = self._threads.get(key)
        if new is None:
            if len(self._threads) >= MAX_THREADS:
                raise TraceError(f"more than {MAX_THREADS} threads (distinct pid and tid "
                                 "pairs): too many to merge")
            new = self._threads[key] = next(self._tids)
        return new

    def _id(self, value: Any) -> Any:
        if is_int(value):
            return value + self._id_base
        if isinstance(value, str):
            try:  # Perfetto reads string ids as hexadecimal
                number = int(value, 16)
            except ValueError:
                return f"{value}@{self._id_base:x}"
            return f"0x{number + self._id_base:x}" if number >= 0 else value
        return value

    def metadata(self, name: str, sort_index: int, args: Mapping[str, Any],
                 labels: str = "") -> list[MetadataEvent]:
        """The process's name, labels and place, and a name and place for each thread."""
        pid = self.pid
        out: list[MetadataEvent] = [
            {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name, **args}},
            {"ph": "M", "name": "process_sort_index", "pid": pid,
             "args": {"sort_index": sort_index}}]
        if labels:
            out.append({"ph": "M", "name": "process_labels", "pid": pid,
                        "args": {"labels": labels}})
        seen = {p: n for n, p in enumerate(dict.fromkeys(p for p, _ in self._threads))}

        def place(item: tuple[tuple[Any, Any], int]) -> tuple[Any, ...]:
            (opid, _otid), tid = item
            proc = self._procs.get(opid, {})
            return (opid != self._main, _number(proc.get("process_sort_index")), seen[opid],
                    _number(self._names.get(tid, {}).get("thread_sort_index")), tid)

        for index, ((opid, otid), tid) in enumerate(sorted(self._threads.items(), key=place)):
            thread = _named(self._names.get(tid, {}).get("thread_name"), "thread", otid)
            if opid != self._main:
                process = _named(self._procs.get(opid, {}).get("process_name"), "process", opid)
                thread = f"{process} {thread}".strip()
            thread = thread or "untitled"
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                        "args": {"name": thread}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                        "args": {"sort_index": index}})
        return out
