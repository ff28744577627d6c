"""Captures beyond the plan: what a role's ``triggers:`` notices at each step boundary.

:class:`StepTriggers` runs on the training thread, at each ``training_step(n)`` boundary:
one clock read and one check of the listener thread's inbox, then a comparison or two. It
notices

- ``on_demand``: requests of ``policy-engine trigger``. The role's listener thread
  (:mod:`policy_engine.runtime.triggers.listener_thread`) reads them, whatever carries
  them: the job's c10d store or Ray actor (already resolved to one step for every rank),
  or request files under ``<output_dir>/triggers/`` (one ``lstat`` of that folder every
  ``poll_seconds``). It checks each one as hostile
  (:mod:`policy_engine.runtime.triggers.requests`) and queues it; here each is honoured
  once per process, and a bad one gets one warning and a manifest ``note``;
- ``signal``: ``SIGUSR2`` arrived since the last step (the handler only counts). In a job
  of several ranks, the listener thread turns it into a request of the whole role for
  one agreed step;
- ``slow_step``: the step that just ended took more than ``factor`` x the running median
  of recent steps (start of one step to the start of the next). With ``scope: job`` the
  slow rank and its ``reference`` ranks capture one agreed later step.

``stall`` opens no capture: the listener thread watches the step from the numbers handed
to it here (:mod:`policy_engine.runtime.triggers.stall_watch`).

Nothing here may stop training: whatever goes wrong is caught, warned about once, and the
step goes on as the plan says. The budget that bounds every capture (``limits:``) is
:class:`~policy_engine.runtime.process.budget.Budget`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from policy_engine.files.layout import host_name
from policy_engine.language.values.ranks import RankSelector
from policy_engine.language.values.selector import SelectorError
from policy_engine.language.values.triggers import Triggers
from policy_engine.plan.plan import Plan
from policy_engine.runtime.process.budget import spend_of
from policy_engine.runtime.process.state import STATE, warn_once
from policy_engine.runtime.triggers.listener_thread import ListenerThread
from policy_engine.runtime.triggers.messages import Answer, Arrived, NotARequest, Post
from policy_engine.runtime.triggers.parts import MAX_PENDING, Flood, SlowSteps, Want
from policy_engine.runtime.triggers.requests import Request

__all__ = ["ON_DEMAND", "PLAN", "SIGNAL", "SLOW_STEP", "TAKEN_PER_STEP", "StepTriggers",
           "Why"]

log = logging.getLogger("policy_engine")

#: Why a capture opened, as the manifest's ``trigger`` field says.
PLAN, ON_DEMAND, SIGNAL, SLOW_STEP = "plan", "on_demand", "signal", "slow_step"
_clock = time.perf_counter
#: Requests of the listener thread taken at one step, at most (it keeps at most 64
#: waiting).
TAKEN_PER_STEP = 64


class Why(NamedTuple):
    """Why a step is captured beyond the plan: the trigger (``on_demand``, ``signal``,
    ``slow_step``), the request's id (None: no request) and the capture's last step."""

    trigger: str
    request: str | None
    last: int


class StepTriggers:
    """A role's triggers in this process, on the training thread: which coming steps to
    capture, and why. The role's listener thread, when it has one, is :attr:`thread`."""

    def __init__(self, plan: Plan, triggers: Triggers, note: Callable[..., None],
                 where: Callable[[], dict[str, Any]] | None = None) -> None:
        self.plan = plan
        self.note = note  # writes a manifest note line (RoleProfiler._note)
        self.wanted: list[Want] = []
        self.soonest = 0  # no wanted window starts before this step
        self.flood = Flood()
        slow = triggers.slow_step
        # the slow-step detector, None once it has reported ``max`` slow steps
        self.slow = None if slow is None or slow.max < 1 else SlowSteps(slow)
        # the role's triggers concern the job: several ranks, or a channel chosen
        job = plan.world > 1 or triggers.channel != "auto"
        self.job_slow = job and slow is not None and slow.scope == "job"
        # a process alone notices its signals here; in a job the listener thread does
        self.signal = triggers.signal and not job
        self.signals = STATE.hooks.usr2_count
        # the listener thread reads the requests (on_demand), and in a job posts those of
        # the whole role; those its ranks post come back through the channel. It also
        # watches for stalls (``where``: the role's position, for a stall record)
        listens = triggers.on_demand or (job and (triggers.signal or self.job_slow)) or \
            triggers.stall is not None
        self.thread = ListenerThread(plan, triggers, job=job, note=note, where=where) \
            if listens else None

    def close(self) -> None:
        """The profiler closed: its listener thread stops."""
        if self.thread is not None:
            self.thread.close()

    def at_step(self, n: int, captured: bool) -> Why | None:
        """At the start of outer step ``n``: why to capture it beyond the plan (None: no
        reason), with the request and the last step of that capture. ``captured``: the
        previous step was inside a capture (its time says nothing about training).
        Never raises: a failure warns once and captures nothing more."""
        try:  # one frame, not two: this runs every step
            now = _clock()
            slow = self.slow
            if slow is not None:  # SlowSteps, inline: a call costs as much as the rest
                if n == slow.last_step + 1 and not captured:
                    took = now - slow.last_start  # step n-1's time, not a profiled one
                    if took > slow.threshold:
                        self._slow(n, took)
                    slow.recent.append(took)
                    if n >= slow.next_median:
                        slow.take_median(n)
                slow.last_start = now
                slow.last_step = n
            thread = self.thread
            if thread is not None:  # two attribute writes: the thread publishes them
                thread.step, thread.stamp = n, now
                if not thread.trainer:  # the thread that runs the steps, for stall records
                    thread.trainer = threading.get_ident()
                if thread.inbox:
                    self._take(thread, n)
            if self.signal and STATE.hooks.usr2_count != self.signals:
                self.signals = STATE.hooks.usr2_count
                self._want(Want(n, n, SIGNAL, None, False))
            if not self.wanted or n < self.soonest:
                return None
            return self._wanted(n)
        except Exception as err:
            warn_once(("listener", self.plan.role, type(err).__name__),
                      "policy-engine: role %r: the trigger listener failed at step %s "
                      "(%s: %s); training goes on, captures beyond the plan may be missed",
                      self.plan.role, n, type(err).__name__, err)
            return None

    def _take(self, thread: ListenerThread, n: int) -> None:
        """What the listener thread read (checked there), a bounded number."""
        inbox = thread.inbox
        for _ in range(TAKEN_PER_STEP):
            if not inbox:
                return
            match inbox.popleft():
                case Arrived(request, where):
                    self._offer(request, n, where)
                case NotARequest(rid, why, where):
                    self._refuse(rid, why, where)

    def _wanted(self, n: int) -> Why | None:
        """Why step ``n`` is wanted (the earliest reason), and what is still wanted after."""
        found = None
        keep: list[Want] = []
        for want in self.wanted:
            if want.first <= n <= want.last and found is None:
                found = Why(want.why, want.rid, want.last if want.merged else n)
            if want.first <= n:
                want.first = n + 1
            if want.first <= want.last:
                keep.append(want)
        self.wanted = keep
        self.soonest = min((w.first for w in keep), default=0)
        return found

    def _slow(self, n: int, took: float) -> None:
        """Step n-1 took ``took`` seconds, past the threshold: capture step n, or with
        ``scope: job`` ask the slow rank and the reference ranks for one agreed step (at
        most ``max`` times)."""
        slow = self.slow
        assert slow is not None
        slow.left -= 1
        if not slow.left:
            self.slow = None  # max slow steps reported: no step is measured any more
        median = round(slow.median, 6)
        if self.job_slow and self.thread is not None:
            self.note("slow_step", step=n - 1, seconds=round(took, 6), median=median,
                      scope="job")
            report = {"rank": self.plan.rank, "step": n - 1, "seconds": round(took, 6),
                      "median": median}
            self.thread.outbox.append(Post(SLOW_STEP, ranks=slow.spec.reference,
                                           also=(self.plan.rank,), slow=report))
            return
        self._want(Want(n, n, SLOW_STEP, None, False))
        self.note("slow_step", step=n - 1, seconds=round(took, 6), median=median,
                  captures=[n])

    # -- requests -----------------------------------------------------------------
    def _offer(self, request: Request, n: int, where: str) -> None:
        if self._for_me(request, where):
            self._accept(request, n)
        elif request.role == self.plan.role:
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
        thread = self.thread
        if thread is not None and thread.live:
            plan = self.plan
            thread.outbox.append(Answer(rid, dict(
                fields, rank=plan.rank, pid=os.getpid(), host=host_name())))
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
