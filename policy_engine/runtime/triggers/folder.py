"""The ``triggers/`` folder's part in the channel: the advert that tells
``policy-engine trigger`` where the job's store is, the progress files of a job without
one, and requests a process posts there (a signal, a slow step), with the claims that make
a signal every rank got one request.

Every file is written whole by the publisher and read back as hostile
(:func:`~policy_engine.runtime.requests.read_bounded`): never through a link, never more
than a request's size.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Any

from policy_engine.files.publish import make_folders, open_folder, publish, write_atomic
from policy_engine.runtime.channel import MAX_LISTENERS
from policy_engine.runtime.requests import (
    REQUEST_SUFFIX,
    REQUESTS_DIR,
    BadRequest,
    load_bounded,
    read_bounded,
)

__all__ = ["ADVERT", "PROGRESS_DIR", "SIGNALS_DIR", "advertise", "claim_signal",
           "post_request", "publish_progress", "read_advert", "read_progress"]

#: The file under triggers/ that says where the job's channel is (not a request: no
#: ``.json``), and the folder of progress files.
ADVERT = "channel"
PROGRESS_DIR = f"{REQUESTS_DIR}/progress"
#: The folder of signal claims: ``<role>.<k>``, the k-th signal of the role that was
#: posted, saying the step it was agreed on.
SIGNALS_DIR = f"{REQUESTS_DIR}/signals"
_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,128}$")


def _read(output_dir: str, rel: str, name: str) -> Any:
    """A small JSON file, or None (missing, a link, too large, not JSON)."""
    try:
        fd = open_folder(output_dir, rel, create=False)
    except (OSError, ValueError):
        return None
    try:
        data = read_bounded(fd, name)
        return None if data is None else load_bounded(data)
    except BadRequest:
        return None
    finally:
        os.close(fd)


def advertise(output_dir: str, kind: str, where: str) -> None:
    """Say in ``triggers/channel`` where the job's channel is (left alone when it says
    so already: every listener of a node-local folder writes its own)."""
    advert = {"kind": kind, "where": where}
    if read_advert(output_dir) == advert:
        return
    folder = make_folders(output_dir, REQUESTS_DIR)
    publish(os.path.join(folder, ADVERT),
            lambda f: f.write(json.dumps(advert).encode()), force=True)


def read_advert(output_dir: str) -> dict[str, str] | None:
    """``{kind, where}`` from ``triggers/channel``, None when there is none to trust."""
    value = _read(output_dir, REQUESTS_DIR, ADVERT)
    if not isinstance(value, dict) or value.get("kind") not in ("store", "ray") or \
            not isinstance(value.get("where"), str) or len(value["where"]) > 256:
        return None
    return {"kind": value["kind"], "where": value["where"]}


def publish_progress(output_dir: str, role: str, rank: int, report: dict[str, Any]) -> None:
    if not _NAME.match(role):
        return
    folder = make_folders(output_dir, PROGRESS_DIR)
    publish(os.path.join(folder, f"{role}.{rank}"),
            lambda f: f.write(json.dumps(report).encode()), force=True)


def _numbered(fd: int, role: str) -> list[int]:
    """The numbers ``k`` of the files ``<role>.<k>`` in the folder ``fd`` (a bounded
    listing)."""
    found = []
    for name in os.listdir(fd)[:MAX_LISTENERS]:
        if name.startswith(role + ".") and name[len(role) + 1:].isdigit() and \
                len(name) - len(role) <= 20:
            found.append(int(name[len(role) + 1:]))
    return found


def claim_signal(output_dir: str, role: str, target: int, at: int) -> bool:
    """Whether this process posts the request for a signal it got at step ``at`` (agreed
    on ``target``): not when a signal of the role already claimed a step still ahead (the
    job was signalled on every rank: one request, as
    :meth:`~policy_engine.runtime.channel.JobChannel.claim_signal` on the store).

    The claim after claim ``k`` is the file ``<role>.<k+1>``, made by a hard link, which
    never replaces a file: of two ranks claiming at once, one makes it and the other finds
    it taken. A folder that cannot be written is no reason to lose the signal: True."""
    if not _NAME.match(role):
        return True
    try:
        fd = open_folder(output_dir, SIGNALS_DIR)
    except (OSError, ValueError):
        return True
    try:
        taken = _numbered(fd, role)
        last = max(taken, default=-1)
        if last >= 0:
            try:
                data = read_bounded(fd, f"{role}.{last}")
                value = None if data is None else load_bounded(data)
            except BadRequest:
                value = None
            ahead = value.get("step") if isinstance(value, dict) else None
            if isinstance(ahead, int) and not isinstance(ahead, bool) and ahead >= at:
                return False
        body = json.dumps({"step": target, "pid": os.getpid()}).encode()
        try:
            publish(os.path.join(output_dir, SIGNALS_DIR, f"{role}.{last + 1}"),
                    lambda f: f.write(body))
        except FileExistsError:
            return False  # another rank claimed it first
        except OSError:
            return True
        for k in taken:  # the claims before are done with
            with contextlib.suppress(OSError):
                os.unlink(f"{role}.{k}", dir_fd=fd)
        return True
    finally:
        os.close(fd)


def read_progress(output_dir: str, role: str) -> list[Any]:
    """The progress files of ``role``'s processes (what parses; the rest is None)."""
    if not _NAME.match(role):
        return []
    try:
        fd = open_folder(output_dir, PROGRESS_DIR, create=False)
    except (OSError, ValueError):
        return []
    found: list[Any] = []
    try:
        for name in os.listdir(fd)[:MAX_LISTENERS]:
            if name.startswith(role + ".") and name[len(role) + 1:].isdigit():
                try:
                    data = read_bounded(fd, name)
                    found.append(None if data is None else load_bounded(data))
                except BadRequest:
                    found.append(None)
    finally:
        os.close(fd)
    return found


def post_request(output_dir: str, rid: str, body: str) -> None:
    def write(path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(body)
    write_atomic(output_dir, f"{REQUESTS_DIR}/{rid}", REQUEST_SUFFIX, write)
