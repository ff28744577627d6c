"""Reading a memory snapshot pickle (``torch.cuda.memory._dump_snapshot``) as untrusted data.

The unpickler refuses every global, so a hostile file cannot run code. A pickle can also
refer to one object many times (its memo), so a few kilobytes can stand for a list of a
billion entries: before anything replays it, :func:`load_snapshot` counts what the replay
would walk (entries, segments, blocks, frames, repeats included) and refuses a file whose
count is out of proportion to its size, so the work stays bounded by the bytes.
"""

from __future__ import annotations

import os
import pickle
import stat
from typing import Any, NoReturn

from policy_engine.language.values.sizes import human_bytes

#: Larger files are refused rather than read into memory.
MAX_SNAPSHOT_BYTES = 2 << 30
#: The most items the replay may walk: this many per byte of the file, plus a floor. A
#: snapshot without repeated references has fewer items than bytes.
WORK_PER_BYTE = 4
WORK_FLOOR = 1_000_000


class SnapshotError(ValueError):
    """Not a readable memory snapshot, or no such device in it."""

    def __init__(self, reason: str, path: str | None = None) -> None:
        super().__init__(reason if path is None else f"{path}: {reason}")
        self.reason, self.path = reason, path


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


def _bounded(data: dict[str, Any], size: int) -> None:
    """SnapshotError when replaying ``data`` would walk more items than a file of ``size``
    bytes can honestly hold; stops counting at the limit, so this is bounded too."""
    limit = WORK_FLOOR + WORK_PER_BYTE * size
    work = 0

    def add(n: int) -> None:
        nonlocal work
        work += n
        if work > limit:
            raise SnapshotError(
                f"it refers to the same data over and over: more than {limit:,} items to "
                f"replay from {human_bytes(size)} (a damaged or hostile pickle)")

    def frames(d: dict[Any, Any]) -> int:
        found = d.get("frames")
        return len(found) if isinstance(found, list) else 0

    for trace in data["device_traces"]:
        add(1 + len(trace))
        for entry in trace:
            if isinstance(entry, dict):
                add(len(entry) + frames(entry))
    for seg in data["segments"]:
        add(1)
        blocks = seg.get("blocks") if isinstance(seg, dict) else None
        if isinstance(blocks, list):
            add(len(blocks))
            for block in blocks:
                if isinstance(block, dict):
                    add(len(block) + frames(block))


def load_snapshot(path: str, *, max_bytes: int = MAX_SNAPSHOT_BYTES) -> dict[str, Any]:
    """The snapshot dict pickled at ``path``. SnapshotError, naming ``path``, when the file
    is unreadable, not a regular file, empty, too large, truncated, not a snapshot, or
    would take work out of proportion to its size. A link is not followed."""
    try:
        try:  # never blocking on a FIFO planted under the name
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            if os.path.islink(path):
                raise SnapshotError("a symbolic link: give the snapshot itself") from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise SnapshotError("not a regular file")
        with os.fdopen(fd, "rb") as f:
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
        snapshot = check_snapshot(data)
        _bounded(snapshot, size)
        return snapshot
    except SnapshotError as err:
        raise SnapshotError(err.reason, path) from None
    except OSError as err:
        raise SnapshotError(f"cannot read: {err.strerror or err}", path) from None
