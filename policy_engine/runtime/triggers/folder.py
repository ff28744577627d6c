"""The ``triggers/`` folder as a channel: the request files ``policy-engine trigger``
writes there (:class:`RequestFolder`, read on the listener thread), the advert that tells
the command where the job's store is, the progress files of a job without one, and
requests a process posts there (a signal, a slow step), with the claims that make a
signal every rank got one request.

Every file is written whole by the publisher and read back as hostile
(:func:`~policy_engine.runtime.triggers.requests.read_bounded`): never through a link,
never more than a request's size.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import stat
import time
from typing import Any

from policy_engine.errors import is_int
from policy_engine.files.publish import (
    make_folders,
    open_folder,
    open_temp,
    publish,
    write_atomic,
)
from policy_engine.runtime.process.state import warn_once
from policy_engine.runtime.triggers.channel import MAX_LISTENERS
from policy_engine.runtime.triggers.messages import Arrived, NotARequest
from policy_engine.runtime.triggers.requests import (
    REQUEST_SUFFIX,
    REQUESTS_DIR,
    BadRequest,
    is_request_name,
    load_bounded,
    read_bounded,
    read_request,
)

__all__ = ["ADVERT", "FILES_PER_POLL", "PROGRESS_DIR", "RETRY_SECONDS", "RETRY_TRIES",
           "SIGNALS_DIR", "RequestFolder", "advertise", "claim_signal", "post_request",
           "publish_progress", "read_advert", "read_progress"]

log = logging.getLogger("policy_engine")

#: The file under triggers/ that says where the job's channel is (not a request: no
#: ``.json``), and the folder of progress files.
ADVERT = "channel"
PROGRESS_DIR = f"{REQUESTS_DIR}/progress"
#: The folder of signal claims: ``<role>.<k>``, the k-th signal of the role that was
#: posted, saying the step it was agreed on.
SIGNALS_DIR = f"{REQUESTS_DIR}/signals"
_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,128}$")
#: A request file that does not parse is read again at later polls until both this many
#: tries and this many seconds have passed; then it is refused (a warning and a note).
RETRY_TRIES = 3
RETRY_SECONDS = 10.0
#: Request files read at one poll, at most (the rest wait for the next poll).
FILES_PER_POLL = 16


class RequestFolder:
    """The request files under ``<output_dir>/triggers/``, as the listener thread reads
    them: one ``lstat`` of the folder a poll, its listing only when it changed (or a file
    waits to be read again), each file read once per process."""

    def __init__(self, output_dir: str) -> None:
        self.output_dir = output_dir
        self.path = os.path.join(output_dir, REQUESTS_DIR)
        self.seen: set[str] = set()  # request files done with: read, refused or not ours
        self.retry: dict[str, tuple[int, float]] = {}  # half-written: (tries, first seen)
        self.backlog = False  # more new files than one poll reads
        self.mtime = -1

    def start(self, role: str) -> None:
        """Make the folder (it tells ``policy-engine trigger`` that someone listens) and
        pass over the requests already there: they are older than this process (a
        restarted job). A folder that cannot be made or read is one warning: the role
        listens to nothing there."""
        try:
            make_folders(self.output_dir, REQUESTS_DIR)
            fd = open_folder(self.output_dir, REQUESTS_DIR, create=False)
            try:
                self.seen = {n for n in os.listdir(fd) if is_request_name(n)}
            finally:
                os.close(fd)
        except Exception as err:  # a planted link, a read-only folder
            log.warning("policy-engine: role %r cannot listen for trigger requests in %s: "
                        "%s", role, self.path, getattr(err, "strerror", None) or err)

    def look(self) -> list[Arrived | NotARequest]:
        """The requests written since the last look, at most :data:`FILES_PER_POLL`."""
        try:
            found = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return []
        if not stat.S_ISDIR(found.st_mode):
            warn_once(("requests-folder", self.path),
                      "policy-engine: %s is not a folder (a symbolic link?): trigger "
                      "requests there are not read", self.path)
            return []
        # A folder changed within the last seconds is listed again: a request written in
        # the same tick of its clock as the last listing would be missed otherwise.
        if found.st_mtime_ns == self.mtime and time.time() - found.st_mtime > 2 and \
                not self.retry and not self.backlog:
            return []
        self.mtime = found.st_mtime_ns
        try:
            fd = open_folder(self.output_dir, REQUESTS_DIR, create=False)
        except OSError as err:
            warn_once(("requests-folder", self.path),
                      "policy-engine: trigger requests in %s are not read: %s", self.path,
                      err.strerror or err)
            return []
        try:
            new = sorted(name for name in os.listdir(fd)
                         if name not in self.seen and is_request_name(name))
            self.backlog = len(new) > FILES_PER_POLL
            read = (self._read(fd, name) for name in new[:FILES_PER_POLL])
            return [item for item in read if item is not None]
        finally:
            os.close(fd)

    def _read(self, fd: int, name: str) -> Arrived | NotARequest | None:
        """File ``name``: a request, a refusal, or None (gone, or read again later)."""
        where = os.path.join(self.path, name)
        try:
            request = read_request(fd, name)
        except BadRequest as bad:
            if not bad.final and self._again(name):
                return None  # perhaps still being written: read it at the next poll
            self._done(name)
            return NotARequest(name[:-len(REQUEST_SUFFIX)], bad.message, where)
        self._done(name)
        return None if request is None else Arrived(request, where)

    def _done(self, name: str) -> None:
        self.seen.add(name)
        self.retry.pop(name, None)

    def _again(self, name: str) -> bool:
        """Whether a file that does not parse yet is tried again later."""
        now = time.monotonic()
        tries, since = self.retry.get(name, (0, now))
        tries += 1
        if tries >= RETRY_TRIES and now - since >= RETRY_SECONDS:
            return False
        self.retry[name] = (tries, since)
        return True


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
    :meth:`~policy_engine.runtime.triggers.channel.JobChannel.claim_signal` on the store).

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
            if is_int(ahead) and ahead >= at:
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
        with open_temp(path, text=True) as f:
            f.write(body)
    write_atomic(output_dir, f"{REQUESTS_DIR}/{rid}", REQUEST_SUFFIX, write)
