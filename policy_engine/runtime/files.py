"""Output files: created exclusively, never overwriting an earlier trace."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

log = logging.getLogger("policy_engine")


def claim(output_dir: str, stem: str, ext: str) -> str:
    """Create ``output_dir/stem+ext`` exclusively; on a clash, ``stem.1+ext``, ``stem.2``...

    Returns the path claimed (an empty file). A clash is warned about: it means two
    captures rendered the same name.
    """
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
    folder, base = os.path.split(final)
    tmp = os.path.join(folder, f".{base[: -len(ext) or None]}.{os.getpid()}.tmp{ext}")
    try:
        writer(tmp)
        os.replace(tmp, final)
    except BaseException:
        for leftover in (tmp, final):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
        raise
    return final
