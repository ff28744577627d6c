"""Output files: created exclusively, never overwriting an earlier trace."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from ..naming import MAX_COMPONENT_BYTES, shorten

log = logging.getLogger("policy_engine")


def claim(output_dir: str, stem: str, ext: str) -> str:
    """Create ``output_dir/stem+ext`` exclusively; on a clash, ``stem.1+ext``, ``stem.2``...

    Returns the path claimed (an empty file). A clash is warned about: it means two
    captures rendered the same name.
    """
    # Room for the backend's extension and a clash suffix within the file system's limit.
    folder, base = os.path.split(stem)
    stem = os.path.join(folder, shorten(base, MAX_COMPONENT_BYTES - len(ext.encode()) - 4))
    first = os.path.join(output_dir, stem + ext)
    os.makedirs(os.path.dirname(first), exist_ok=True)
    n = 0
    while True:
        path = first if n == 0 else os.path.join(output_dir, f"{stem}.{n}{ext}")
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            n += 1
            continue
        if n:
            log.warning("policy-engine: %s already exists; this trace is %s", first, path)
        return path


def write_exclusive(output_dir: str, stem: str, ext: str,
                    writer: Callable[[str], Any]) -> str:
    """Claim a name, let ``writer(tmp_path)`` write the file, then move it into place.

    The temporary file keeps ``ext`` so writers that compress by extension (``.gz``) do.
    """
    final = claim(output_dir, stem, ext)
    # Short and hidden, in the same folder (so the final rename is atomic).
    tmp = os.path.join(os.path.dirname(final),
                       f".policy-engine-{os.getpid()}-{threading.get_ident()}.tmp{ext}")
    try:
        writer(tmp)
        os.replace(tmp, final)
    except BaseException:
        for leftover in (tmp, final):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
        raise
    return final
