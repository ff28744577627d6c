"""Captures beyond the plan: what a role's ``triggers:`` notices.

:class:`Listener` is what a role with ``triggers:`` runs at each ``training_step(n)``
boundary: one clock read, then a comparison or two. It notices

- ``on_demand``: requests of ``policy-engine trigger``. In a job of several ranks they
  come through the job's channel (:mod:`policy_engine.runtime.courier`, a listener thread
  that does every network call), already resolved to one step for every rank; otherwise
  from request files under ``<output_dir>/triggers/`` (one ``lstat`` of that folder every
  ``poll_seconds`` at most; never a collective), each honoured once per process. Every
  request is read as hostile (:mod:`policy_engine.runtime.requests`): a bad one gets one
  warning and a manifest ``note``; a file that does not parse yet (half-written) is read
  again at the next polls, for a bounded time;
- ``signal``: ``SIGUSR2`` arrived since the last step (the handler only counts). In a job
  of several ranks, the listener thread turns it into a request of the whole role for
  one agreed step;
- ``slow_step``: the step that just ended took more than ``factor`` x the running median
  of recent steps (start of one step to the start of the next). With ``scope: job`` the
  slow rank and its ``reference`` ranks capture one agreed later step.

Nothing here may stop training: whatever goes wrong in the listener is caught, warned
about once, and the step goes on as the plan says. The budget that bounds every capture
(``limits:``) is :class:`~policy_engine.runtime.budget.Budget`.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable
from typing import Any

from policy_engine.files.publish import make_folders, open_folder
from policy_engine.language.values.ranks import RankSelector
from policy_engine.language.values.selector import SelectorError
from policy_engine.language.values.triggers import Triggers
from policy_engine.plan.plan import Plan
from policy_engine.runtime import manifest
from policy_engine.runtime.budget import Budget, spend_of
from policy_engine.runtime.courier import Courier, courier_for
from policy_engine.runtime.requests import (
    REQUEST_SUFFIX,
    REQUESTS_DIR,
    BadRequest,
    Request,
    is_request_name,
    read_request,
    write_request,
)
from policy_engine.runtime.state import STATE, warn_once
from policy_engine.runtime.trigger_parts import MAX_PENDING, Flood, SlowSteps, Want

__all__ = ["ON_DEMAND", "PLAN", "REQUESTS_DIR", "REQUEST_SUFFIX", "SIGNAL", "SLOW_STEP",
           "Budget", "Listener", "write_request"]

log = logging.getLogger("policy_engine")

#: Why a capture opened, as the manifest's ``trigger`` field says.
PLAN, ON_DEMAND, SIGNAL, SLOW_STEP = "plan", "on_demand", "signal", "slow_step"
_clock = time.perf_counter
#: A request file that does not parse is read again at later polls until both this many
#: tries and this many seconds have passed; then it is refused (a warning and a note).
RETRY_TRIES = 3
RETRY_SECONDS = 10.0
#: Request files read at one poll, at most (the rest wait for the next poll).
READS_PER_POLL = 16
#: Requests of the job's channel taken at one step, at most (the listener thread keeps
#: at most 64 waiting).
TAKEN_PER_STEP = 64


class _Folder:
    """Request files under ``<output_dir>/triggers/``, read on the training thread: one
    ``lstat`` every ``poll_seconds``, the listing only when the folder changed."""

    def __init__(self, plan: Plan, poll: float) -> None:
        self.output_dir = plan.output_dir
        self.path = os.path.join(plan.output_dir, REQUESTS_DIR)
        self.poll = poll
        self.seen: set[str] = set()  # request files done with: read, refused or not ours
        self.retry: dict[str, tuple[int, float]] = {}  # half-written: (tries, first seen)
        self.backlog = False  # more new files than one poll reads
        self.next_poll = 0.0
        self.mtime = -1

    def start(self, role: str) -> None:
        try:  # the folder tells `policy-engine trigger` that someone listens
            make_folders(self.output_dir, REQUESTS_DIR)
            fd = open_folder(self.output_dir, REQUESTS_DIR, create=False)
            try:
                # Requests older than this process are not for it (a restarted job).
                self.seen = {n for n in os.listdir(fd) if is_request_name(n)}
            finally:
                os.close(fd)
        except Exception as err:  # a planted link, a read-only folder: listen to nothing
            log.warning("policy-engine: role %r cannot listen for trigger requests in %s: "
                        "%s", role, self.path, getattr(err, "strerror", None) or err)

    def look(self, now: float) -> list[tuple[Any, ...]]:
        """What is new, at most every ``poll`` seconds: ``("request", Request, where)`` or
        ``("bad", request id, why, where)``."""
        if now < self.next_poll:
            return []
        self.next_poll = now + self.poll
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
            self.backlog = len(new) > READS_PER_POLL
            return [item for name in new[:READS_PER_POLL]
                    for item in self._consider(fd, name)]
        finally:
            os.close(fd)

    def _consider(self, fd: int, name: str) -> list[tuple[Any, ...]]:
        rid = name[:-len(REQUEST_SUFFIX)]
        where = os.path.join(self.path, name)
        try:
            request = read_request(fd, name)
        except BadRequest as bad:
            if not bad.final and self._again(name):
                return []  # perhaps still being written: read it at the next poll
            self.seen.add(name)
            self.retry.pop(name, None)
            return [("bad", rid, bad.message, where)]
        self.seen.add(name)
        self.retry.pop(name, None)
        return [] if request is None else [("request", request, where)]

    def _again(self, name: str) -> bool:
        """Whether a file that does not parse yet is tried again later."""
        now = _clock()
        tries, since = self.retry.get(name, (0, now))
        tries += 1
        if tries >= RETRY_TRIES and now - since >= RETRY_SECONDS:
            return False
        self.retry[name] = (tries, since)
        return True


# ------------------------------------------------------------------ the listener


class Listener:
    """A role's triggers in this process: which coming steps to capture, and why."""

    def __init__(self, plan: Plan, triggers: Triggers, note: Callable[..., None]) -> None:
        self.plan = plan
        self.note = note  # writes a manifest note line (RoleProfiler._note)
        self.wanted: list[Want] = []
        self.soonest = 0  # no wanted window starts before this step
        self.flood = Flood()
        self.signal = triggers.signal
        self.signals = STATE.usr2_count
        self.folder = _Folder(plan, triggers.poll_seconds)
        slow = triggers.slow_step
        self.slow = None if slow is None else SlowSteps(slow)
        self.job_slow = slow is not None and slow.scope == "job"
        # the listener thread, in a job of several ranks (None: this process alone)
        self.courier: Courier | None = courier_for(plan, triggers)
        # triggers/ carries the command's requests (on_demand) and, in a job without a
        # store, those its ranks post there (a signal, a slow step of the job)
        self.reads_folder = triggers.on_demand or (
            self.courier is not None and (self.signal or self.job_slow))
        if self.reads_folder:
            self.folder.start(plan.role)

    def close(self) -> None:
        """The profiler closed: its listener thread stops."""
        if self.courier is not None:
            self.courier.close()

    def at_step(self, n: int, captured: bool) -> tuple[str, str | None, int] | None:
        """At the start of outer step ``n``: why to capture it beyond the plan (None: no
        reason), with the request and the last step of that capture. ``captured``: the
        previous step was inside a capture (its time says nothing about training).
        Never raises: a listener that fails warns once and captures nothing more."""
        try:  # one frame, not two: this runs every step
            now = _clock()
            if self.slow is not None:
                took = self.slow.measure(n, now, captured)
                if took is not None:
                    self._slow(n, took)
            courier = self.courier
            if courier is not None:  # two attribute writes: the thread publishes them
                courier.step, courier.stamp = n, now
                if courier.inbox:
                    self._take(courier, n)
            if self.signal and STATE.hooks.usr2_count != self.signals:
                self.signals = STATE.hooks.usr2_count
                if courier is None:
                    self._want(Want(n, n, SIGNAL, None, False))
                else:  # the job's signal: every rank of the role, one agreed step
                    courier.outbox.append(("post", {"ranks": None, "why": SIGNAL}))
            if self.reads_folder and (courier is None or not courier.live):
                for item in self.folder.look(now):
                    self._handle(item, n)
            if not self.wanted or n < self.soonest:
                return None
            return self._wanted(n)
        except Exception as err:
            warn_once(("listener", self.plan.role, type(err).__name__),
                      "policy-engine: role %r: the trigger listener failed at step %s "
                      "(%s: %s); training goes on, captures beyond the plan may be missed",
                      self.plan.role, n, type(err).__name__, err)
            return None

    def _take(self, courier: Courier, n: int) -> None:
        """The requests the listener thread read (checked there), a bounded number."""
        inbox = courier.inbox
        for _ in range(TAKEN_PER_STEP):
            if not inbox:
                return
            self._handle(inbox.popleft(), n)

    def _wanted(self, n: int) -> tuple[str, str | None, int] | None:
        """Why step ``n`` is wanted (the earliest reason), and what is still wanted after."""
        found = None
        keep: list[Want] = []
        for want in self.wanted:
            if want.first <= n <= want.last and found is None:
                found = (want.why, want.rid, want.last if want.merged else n)
            if want.first <= n:
                want.first = n + 1
            if want.first <= want.last:
                keep.append(want)
        self.wanted = keep
        self.soonest = min((w.first for w in keep), default=0)
        return found

    def _slow(self, n: int, took: float) -> None:
        """Step n-1 took ``took`` seconds, past the threshold: capture step n, or with
        ``scope: job`` ask the slow rank and the reference ranks for one agreed step."""
        assert self.slow is not None
        median = round(self.slow.median, 6)
        if self.job_slow and self.courier is not None:
            self.note("slow_step", step=n - 1, seconds=round(took, 6), median=median,
                      scope="job")
            slow = {"rank": self.plan.rank, "step": n - 1, "seconds": round(took, 6),
                    "median": median}
            self.courier.outbox.append(("post", {
                "ranks": self.slow.spec.reference, "also": [self.plan.rank],
                "why": SLOW_STEP, "slow": slow}))
            return
        self._want(Want(n, n, SLOW_STEP, None, False))
        self.note("slow_step", step=n - 1, seconds=round(took, 6), median=median,
                  captures=[n])

    # -- requests -----------------------------------------------------------------
    def _handle(self, item: tuple[Any, ...], n: int) -> None:
        if item[0] == "bad":
            self._refuse(item[1], item[2], item[3])
        elif item[0] == "request":
            self._offer(item[1], n, item[2])

    def _offer(self, request: Request, n: int, where: str) -> None:
        if self._for_me(request, where):
            self._accept(request, n)
        elif request.role == self.plan.role and self.courier is not None:
            self._answer(request.id, status="not_selected", note=False)

    def _answer(self, rid: str, *, note: bool = True, **fields: Any) -> bool:
        """A request's answer: a manifest note, and the job's channel when it carries it.
        Notes are throttled per status (:class:`Flood`): False when this one was left
        out."""
        noted = note
        if note:
            left_out = self.flood.admit(str(fields.get("status")))
            noted = left_out is not None
            if left_out:
                fields["left_out"] = left_out
            if noted:
                self.note("trigger", request=rid, **fields)
        courier = self.courier
        if courier is not None and courier.live:
            plan = self.plan
            courier.outbox.append(("answer", rid, dict(
                fields, rank=plan.rank, pid=os.getpid(), host=manifest.host_name())))
        return noted

    def _refuse(self, rid: str, why: str, where: str) -> None:
        """A request that is not one: a warning and a note, at most a few per minute."""
        if self._answer(rid, status="refused", message=why):
            log.warning("policy-engine: ignoring trigger request %s: %s", where, why)

    def _for_me(self, request: Request, where: str) -> bool:
        plan = self.plan
        if request.role != plan.role:
            return False
        if plan.rank in request.also:
            return True
        if request.ranks is None:
            return not request.also
        try:
            selector = RankSelector.parse(request.ranks)
        except SelectorError as err:
            self._refuse(request.id, f"ranks {request.ranks!r}: {err.message}", where)
            return False
        coords = dict(plan.coords, local_rank=plan.local_rank, node=plan.node)
        return selector.matches(plan.rank, plan.world, coords, {})

    def _accept(self, request: Request, n: int) -> None:
        rid = request.id
        first = n if request.step is None else request.step
        last = first + request.count - 1
        why: dict[str, Any] = {} if request.why == ON_DEMAND else {"trigger": request.why}
        if request.slow is not None:
            why.update(slow=request.slow, reference=request.ranks)
        if last < n:
            self._answer(rid, status="missed", at=n, first=first, last=last, **why,
                         message=f"asked for steps {first}-{last}; this process is at "
                                 f"step {n}")
            return
        first = max(first, n)
        merged = self.plan.merge_steps
        extra: dict[str, Any] = {}
        if len(self.wanted) >= MAX_PENDING and not self._make_room(first, n):
            self._answer(rid, status="refused", at=n, **why,
                         message=f"{MAX_PENDING} requests of the role wait for steps before "
                                 "these in this process")
            return
        left = self._captures_left()
        if left is not None:  # the windows that come first take the budget first
            pending = sum(w.captures() for w in self.wanted if w.first <= first)
            left = max(0, left - pending)
            if left == 0:
                counted = f" (counting the {pending} waiting)" if pending else ""
                self._answer(rid, status="refused", at=n, **why,
                             message=f"limits.captures is spent in this process{counted}")
                return
            if not merged and last - first + 1 > left:  # one capture per step
                last = first + left - 1
                extra["message"] = f"limits.captures allows {left} more capture(s)"
        self._want(Want(first, last, request.why, rid, merged))
        self._answer(rid, status="accepted", at=n, first=first, last=last, **why, **extra)

    def _want(self, want: Want) -> None:
        self.wanted.append(want)
        self.soonest = min(self.soonest, want.first) if len(self.wanted) > 1 else want.first

    def _make_room(self, first: int, n: int) -> bool:
        """:data:`MAX_PENDING` windows wait: drop the one that starts last when it starts
        after ``first`` (a flood of far-off requests never keeps a near one out)."""
        last = max(self.wanted, key=lambda w: w.first)
        if last.first <= first:
            return False
        self.wanted.remove(last)
        if last.rid is not None:
            self._answer(last.rid, status="dropped", at=n, first=last.first, last=last.last,
                         message=f"{MAX_PENDING} requests of the role wait for sooner steps "
                                 "in this process")
        return True

    def _captures_left(self) -> int | None:
        """Captures the role's limits still allow in this process (None: unlimited)."""
        limits = self.plan.spec.limits
        if limits.captures is None:
            return None
        return max(0, limits.captures - spend_of(self.plan.role).cycles)
