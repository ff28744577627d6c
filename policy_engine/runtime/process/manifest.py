"""Writing the per-process manifest: one JSON line per event, whole or not at all. The lines
are declared and built in :mod:`policy_engine.files.records`; this module turns them into
bytes and appends them, and :mod:`policy_engine.analysis.manifests` reads them."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
from collections.abc import Mapping
from typing import Any

from policy_engine.files.layout import MANIFEST_DIR, MANIFEST_SUFFIX, host_name
from policy_engine.files.publish import folder
from policy_engine.runtime.process.state import STATE

# Read too: the last byte says whether a torn line needs ending first.
_FILE_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC



def manifest_path(output_dir: str) -> str:
    """This process's manifest file for ``output_dir``."""
    key = (os.getpid(), output_dir)  # a forked child gets its own file
    with STATE.lock:
        path = STATE.manifests.get(key)
        if path is None:
            name = f"{host_name()}_pid{os.getpid()}_{STATE.started}{MANIFEST_SUFFIX}"
            path = os.path.join(output_dir, MANIFEST_DIR, name)
            STATE.manifests[key] = path
        return path


def _plain(value: Any) -> Any:
    """``value`` with NaN and infinities replaced by None (they are not JSON) and every
    key a string (so keys sort)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def encode(record: Mapping[str, Any]) -> bytes:
    """One manifest line: JSON, ASCII only (so valid UTF-8 whatever strings it holds)."""
    def dump(data: Any) -> str:
        return json.dumps(data, sort_keys=True, default=str, ensure_ascii=True,
                          allow_nan=False)
    try:
        text = dump(record)
    except (ValueError, TypeError):
        text = dump(_plain(record))
    return (text + "\n").encode("ascii")


def append(output_dir: str, record: Mapping[str, Any]) -> None:
    """Append ``record`` as one line of this process's manifest: the whole line or nothing.

    ``manifests/`` is made without following links, and the file is opened with
    ``O_NOFOLLOW``. A short write is cut back off. Raises OSError when the line could not
    be written (the file then ends as it did before).
    """
    line = encode(record)
    name = os.path.basename(manifest_path(output_dir))
    # One append at a time in this process; a SIGTERM that arrives meanwhile waits for the
    # line to be whole (STATE.lock is a GuardedLock, runtime.process.state).
    with STATE.lock, folder(output_dir, MANIFEST_DIR) as dir_fd:
        fd = os.open(name, _FILE_FLAGS, 0o644, dir_fd=dir_fd)
        try:
            before = os.fstat(fd).st_size
            if before and os.pread(fd, 1, before - 1) != b"\n":
                line = b"\n" + line  # never glue this line onto a torn one
            try:
                written = os.write(fd, line)
            except BaseException:
                _cut(fd, before)
                raise
            if written != len(line):
                what = "cut off" if _cut(fd, before) else "left in place: it could not be cut"
                raise OSError(errno.EIO, f"short write to {manifest_path(output_dir)}: "
                              f"{written} of {len(line)} bytes (the part written was {what})")
        finally:
            os.close(fd)


def _cut(fd: int, size: int) -> bool:
    """Remove what a failed append left after ``size`` bytes; whether that worked."""
    try:
        if os.fstat(fd).st_size > size:
            os.ftruncate(fd, size)
    except OSError:
        return False
    return True


def file_hash(paths: tuple[str, ...]) -> str | None:
    """A digest of the policy files a plan came from (None for mapping policies)."""
    if not paths:
        return None
    digest = hashlib.sha256()
    for path in paths:
        try:
            with open(path, "rb") as f:
                digest.update(f.read())
        except OSError:
            return None
    return digest.hexdigest()[:16]
