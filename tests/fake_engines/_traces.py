"""What the stand-in workers write: a small gzipped Chrome trace per rank."""

from __future__ import annotations

import gzip
import json
import os
import time
from typing import Any


def write_trace(path: str, rank: int, world: int, label: str, *, gz: bool = True) -> None:
    """A trace with a few CPU events and the distributedInfo torch writes."""
    base = time.time_ns() // 1000
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "cpu_op", "name": f"{label}::forward", "pid": os.getpid(),
         "tid": 1, "ts": base + 10 * i, "dur": 8, "args": {}} for i in range(4)]
    data = {"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": world},
            "traceEvents": events, "baseTimeNanoseconds": 0}
    raw = json.dumps(data).encode()
    with open(path, "wb") as f:
        f.write(gzip.compress(raw) if gz else raw)
