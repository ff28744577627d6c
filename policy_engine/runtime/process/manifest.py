"""Writing the per-process manifest: one JSON line per event, whole or not at all. The lines
are declared and built in :mod:`policy_engine.files.records`; this module turns them into
bytes and appends them, and :mod:`policy_engine.analysis.manifests` reads them.

A process's manifest under an output folder is a series of files in ``manifests/``, named
by :func:`~policy_engine.files.layout.manifest_name`: ``<host>_pid<pid>_<start>`` with
the suffix, then ``<host>_pid<pid>_<start>.2``, ``.3``... Once a file holds
:data:`ROTATE_LINES` lines, or the next line would take it past :data:`ROTATE_BYTES`, the
next line starts the next file: half of what a reader takes of one file
(``analysis.manifests.MAX_MANIFEST_LINES`` and ``MAX_MANIFEST_BYTES``), so the newest
lines of a long run are never past a reader's cut. A line is never split across files.

``manifests/`` is shared: whatever sits under the manifest's name is taken as found. A
symbolic link is refused (OSError); anything else that is not a regular file (a FIFO, a
device, a folder) is neither opened for writing nor written to: the line is dropped, with
one warning naming the file and what it is, and training goes on. Lines are written under
the manifests' own lock (``STATE.manifest_lock``: a SIGTERM waits until the line is
whole), never under the process's lock the training and export threads need, and only
into a regular file, where a write does not wait for a reader.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import stat
from collections.abc import Mapping
from typing import Any

from policy_engine.files.layout import MANIFEST_DIR, host_name, manifest_name
from policy_engine.files.publish import folder
from policy_engine.runtime.process.state import STATE, warn_once

#: A manifest file takes no line past this many lines or bytes; the next file does.
ROTATE_LINES = 10_000
ROTATE_BYTES = 8 << 20
# Read too: the last byte says whether a torn line needs ending first. O_NONBLOCK and
# O_NOCTTY: should a FIFO or a terminal be swapped in after it was looked at, opening it
# neither waits for the other end nor makes it this process's terminal.
_FILE_FLAGS = (os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
               | os.O_NOCTTY | os.O_CLOEXEC)
#: Files one line may move past: full ones left under the same names (the same pid and
#: second) are skipped, but not without end in a folder someone fills on purpose.
_MOST_MOVES = 64
_COUNT_CHUNK = 1 << 20
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class _Manifest:
    """This process's manifest under one output folder: the file lines go to now."""

    __slots__ = ("lines", "number", "stem")

    def __init__(self, stem: str) -> None:
        self.stem = stem
        self.number = 1
        self.lines: int | None = None  # in the current file (None: not looked at yet)

    @property
    def name(self) -> str:
        return manifest_name(self.stem, self.number)

    def move_on(self) -> None:
        self.number += 1
        self.lines = None


def _current(output_dir: str) -> _Manifest:
    """This process's manifest under ``output_dir`` (under STATE.manifest_lock)."""
    key = (os.getpid(), output_dir)  # a forked child gets its own file
    found = STATE.manifests.get(key)
    if not isinstance(found, _Manifest):  # none yet: the slot holds nothing else
        found = _Manifest(f"{host_name()}_pid{os.getpid()}_{STATE.started}")
        STATE.manifests[key] = found
    return found


def manifest_path(output_dir: str) -> str:
    """This process's current manifest file for ``output_dir`` (the one the next line
    goes to, unless it is full)."""
    with STATE.manifest_lock:
        return os.path.join(output_dir, MANIFEST_DIR, _current(output_dir).name)


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
    be written (the file then ends as it did before). A manifest name that holds something
    other than a regular file or a link gets no line: one warning, no error.
    """
    line = encode(record)
    # One line at a time in this process; a SIGTERM that arrives meanwhile waits for the
    # line to be whole (a GuardedLock, runtime.process.state).
    with folder(output_dir, MANIFEST_DIR) as dir_fd, STATE.manifest_lock:
        refused = _append(dir_fd, output_dir, line)
    if refused is not None:  # said outside the lock: a log handler may be slow
        warn_once(("manifest-kind", refused[0]), "policy-engine: the manifest %s is %s, not "
                  "a regular file: lines meant for it are not written (training goes on; "
                  "said once)", *refused)


def _append(dir_fd: int, output_dir: str, line: bytes) -> tuple[str, str] | None:
    """Write ``line`` into the current file, moving on to the next one when it is full;
    (the file, what it is) when the current name holds no regular file."""
    current = _current(output_dir)
    for moves in range(_MOST_MOVES + 1):
        name = current.name
        shown = os.path.join(output_dir, MANIFEST_DIR, name)
        try:  # looked at first: a device or a FIFO is not even opened
            kind = _kind(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            kind = None
        if kind is not None and kind != "a symbolic link":  # a link: open() refuses it
            return shown, kind
        fd = os.open(name, _FILE_FLAGS, 0o644, dir_fd=dir_fd)
        try:
            info = os.fstat(fd)
            kind = _kind(info.st_mode)
            if kind is not None:  # swapped in after it was looked at
                return shown, kind
            before = info.st_size
            if current.lines is None:
                current.lines = _count_lines(fd, before)
            data = line
            if before and os.pread(fd, 1, before - 1) != b"\n":
                data = b"\n" + line  # never glue this line onto a torn one
            if before and moves < _MOST_MOVES and (
                    current.lines >= ROTATE_LINES or before + len(data) > ROTATE_BYTES):
                current.move_on()  # full: a line is never split across files
                continue
            _write(fd, data, before, shown)
            current.lines += data.count(b"\n")
            return None
        finally:
            os.close(fd)
    raise AssertionError("unreachable: the last move writes")


def _kind(mode: int) -> str | None:
    """What a file that is not a regular file is (None for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return next((what for test, what in _KINDS if test(mode)), "of an unknown kind")


def _count_lines(fd: int, size: int) -> int:
    """The lines a file this process did not write yet holds (one left under the same
    name); only the part a full file may hold is read."""
    lines = offset = 0
    while offset < min(size, ROTATE_BYTES):
        chunk = os.pread(fd, _COUNT_CHUNK, offset)
        if not chunk:
            break
        lines += chunk.count(b"\n")
        offset += len(chunk)
    return lines


def _write(fd: int, data: bytes, before: int, shown: str) -> None:
    """Append ``data`` at ``before``, the end of the file: whole, or cut back off."""
    try:
        written = os.write(fd, data)
    except BaseException:
        _cut(fd, before)
        raise
    if written != len(data):
        what = "cut off" if _cut(fd, before) else "left in place: it could not be cut"
        raise OSError(errno.EIO, f"short write to {shown}: {written} of {len(data)} bytes "
                      f"(the part written was {what})")


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
