"""The output folder's layout: the names the engine, the CLI and the runtime agree on.

::

    <output_dir>/
      <trace names>...          the policy's name templates (language.naming)
      manifests/<host>_pid<pid>_<start><MANIFEST_SUFFIX>  a process's manifest (runtime.process)
      manifests/<host>_pid<pid>_<start>.<k><MANIFEST_SUFFIX>  its k-th file (k >= 2) once
                                the ones before were full: :func:`manifest_name`
      triggers/                 requests to capture (runtime.triggers.requests, cli.trigger)
      stalls/                   what each process was doing when a step stalled
                                (runtime.process.stall_report, analysis.stall_record)
      .policy-engine-<pid>-<random>.tmp<ext>   a file being written (files.publish)

A path component is at most :data:`MAX_COMPONENT_BYTES` bytes; a longer one is cut by
:func:`shorten`, the same way wherever a name is made.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import secrets
import socket

#: The folder of the per-process manifests, and the ending of their names.
MANIFEST_DIR = "manifests"
MANIFEST_SUFFIX = ".manifest.jsonl"
_MANIFEST_PART = re.compile(r"(.+)\.([1-9][0-9]{0,8})$")
#: The folder trigger requests are dropped into.
TRIGGERS_DIR = "triggers"
#: The folder of stall records.
STALLS_DIR = "stalls"
#: The longest file or folder name most file systems take.
MAX_COMPONENT_BYTES = 255

#: How every temporary file the publisher makes starts (hidden, and found by
#: :func:`find_leftovers` when a save never finished).
TEMP_PREFIX = ".policy-engine-"
_TEMP_PATTERN = TEMP_PREFIX + "*.tmp*"
_TEMP_PID = re.compile(re.escape(TEMP_PREFIX) + r"(\d+)-")


def host_name() -> str:
    """The short host name that starts this host's manifest file names."""
    return socket.gethostname().split(".")[0] or "host"


def manifest_name(stem: str, number: int = 1) -> str:
    """The name of file ``number`` of the manifest ``stem`` (``<host>_pid<pid>_<start>``):
    the first keeps the plain name, the ones after it (written once the file before was
    full, runtime.process.manifest) say their number before the suffix."""
    if number < 1:
        raise ValueError(f"manifest files are numbered from 1, not {number}")
    return f"{stem}{MANIFEST_SUFFIX}" if number == 1 else f"{stem}.{number}{MANIFEST_SUFFIX}"


def manifest_part(name: str) -> tuple[str, int] | None:
    """``(stem, number)`` of a manifest file's name, as :func:`manifest_name` makes it;
    None when ``name`` is no manifest's. A ``.1`` is never written: ``x.1.manifest.jsonl``
    is file 1 of the stem ``x.1``."""
    if not name.endswith(MANIFEST_SUFFIX) or len(name) == len(MANIFEST_SUFFIX):
        return None
    stem = name[:-len(MANIFEST_SUFFIX)]
    found = _MANIFEST_PART.match(stem)
    if found is None or found.group(2) == "1":
        return stem, 1
    return found.group(1), int(found.group(2))


def temp_name(ext: str = "") -> str:
    """A new, unpredictable temporary name for a file of this process, keeping ``ext``."""
    return f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(16)}.tmp{ext}"


def shorten(component: str, limit: int = MAX_COMPONENT_BYTES) -> str:
    """``component`` cut to ``limit`` bytes, deterministically: a prefix plus a short hash
    of the whole, so two long names that differ only at the end stay different."""
    raw = component.encode()
    if len(raw) <= limit:
        return component
    digest = hashlib.sha256(raw).hexdigest()[:10]
    keep = raw[: limit - len(digest) - 1].decode(errors="ignore")
    return f"{keep}-{digest}"


def is_temp_name(name: str) -> bool:
    """Whether a file name is one of :func:`write_atomic`'s temporary files."""
    return fnmatch.fnmatchcase(name, _TEMP_PATTERN)


def temp_pid(name: str) -> int | None:
    """The id of the process that made a temporary file, from its name."""
    match = _TEMP_PID.match(name)
    return int(match.group(1)) if match else None


def find_leftovers(root: str) -> list[str]:
    """Temporary files under ``root`` (paths relative to it, sorted): saves that never
    finished, or that are being written right now. Links are not followed."""
    found: list[str] = []
    for here, dirs, files in os.walk(root):
        dirs.sort()
        rel = os.path.relpath(here, root)
        found.extend(os.path.normpath(os.path.join(rel, f)) for f in files if is_temp_name(f))
    return sorted(found)
