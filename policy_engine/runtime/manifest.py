"""The per-process manifest: one JSON line per trace a capture wrote (or failed to write).

Each process appends to its own file under ``<output_dir>/manifests/``. A line is written
with a single ``write`` on an ``O_APPEND`` descriptor, so a crash never leaves half a line
behind another process's or an earlier capture's.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

MANIFEST_DIR = "manifests"
MANIFEST_SUFFIX = ".manifest.jsonl"

_lock = threading.Lock()
_files: dict[str, str] = {}
_started = time.strftime("%Y%m%d%H%M%S")


def manifest_path(output_dir: str) -> str:
    """This process's manifest file for ``output_dir``."""
    with _lock:
        path = _files.get(output_dir)
        if path is None:
            host = socket.gethostname().split(".")[0] or "host"
            name = f"{host}_pid{os.getpid()}_{_started}{MANIFEST_SUFFIX}"
            path = os.path.join(output_dir, MANIFEST_DIR, name)
            _files[output_dir] = path
        return path


def append(output_dir: str, record: Mapping[str, Any]) -> None:
    """Append one record as a JSON line (atomically, with one write)."""
    path = manifest_path(output_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


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


def read_manifests(output_dir: str) -> list[dict[str, Any]]:
    """Every record of every process's manifest under ``output_dir`` (bad lines skipped)."""
    records: list[dict[str, Any]] = []
    for root, _dirs, files in os.walk(output_dir):
        for name in sorted(files):
            if not name.endswith(MANIFEST_SUFFIX):
                continue
            with open(os.path.join(root, name), encoding="utf-8") as f:
                for line in f:
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(record, dict):
                        record["_manifest"] = os.path.join(root, name)
                        records.append(record)
    return records
