"""What ``policy-engine merge`` reads and writes a trace through: the bounds every input
trace is read under (as ``analyze`` and ``report`` read theirs), and the merged trace
written event by event."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import IO, Any

from policy_engine.analysis.chrome_trace import TraceError, TraceEvent, TraceReader, declared_size
from policy_engine.analysis.trace_process import MetadataEvent

__all__ = ["MAX_EVENTS", "MAX_RATIO", "MAX_TRACE_MB", "Bounds", "EventWriter"]

#: A gzipped trace whose text grows past this many times its compressed size is refused
#: (torch traces inflate 10 to 20 times; a gzip bomb, hundreds), as analyze and report do.
MAX_RATIO = 100
#: Defaults of --max-trace-mb (text, after inflating) and --max-events, per trace.
MAX_TRACE_MB = 2048
MAX_EVENTS = 5_000_000
_CHUNK = 1 << 20
_ENCODE = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode


class Bounds:
    """What one trace may make merge read: text (after inflating) and events."""

    def __init__(self, max_bytes: int, max_events: int) -> None:
        self.max_bytes, self.max_events = max_bytes, max_events

    def open(self, path: str) -> TraceReader:
        """The reader of ``path`` under these bounds; TraceError at once for a gzip whose
        trailer says it inflates past them."""
        declared = declared_size(path)
        if declared is not None and declared > self.max_bytes:
            raise TraceError(f"its gzip trailer says it inflates to {declared:,} bytes, over "
                             f"--max-trace-mb {self.max_bytes >> 20}")
        return TraceReader(path, max_bytes=self.max_bytes, max_ratio=MAX_RATIO,
                           max_events=self.max_events)


class EventWriter:
    """A Chrome trace written event by event to ``stream``, a chunk at a time."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.count = 0
        self._stream = stream
        self._parts: list[str] = ['{"displayTimeUnit":"ms","traceEvents":[\n']
        self._size = 0

    def event(self, event: TraceEvent | MetadataEvent) -> None:
        text = _ENCODE(event)
        self._parts.append(",\n" + text if self.count else text)
        self.count += 1
        self._size += len(text)
        if self._size >= _CHUNK:
            self._flush()

    def _flush(self) -> None:
        self._stream.write("".join(self._parts).encode("ascii"))
        self._parts.clear()
        self._size = 0

    def finish(self, tail: Mapping[str, Any]) -> None:
        """End the events, then add the top-level keys of ``tail`` after them (viewers
        that stop at a key they do not know have read every event by then)."""
        self._parts.append("\n]")
        self._parts.extend(f",{_ENCODE(key)}:{_ENCODE(value)}" for key, value in tail.items())
        self._parts.append("}\n")
        self._flush()
