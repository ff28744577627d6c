"""Captures beyond the plan, and the budget that bounds every capture.

:class:`Listener` is what a role with ``triggers:`` runs at each ``training_step(n)``
boundary: one clock read, then a comparison or two. It notices

- ``on_demand``: request files that ``policy-engine trigger`` writes under
  ``<output_dir>/triggers/`` (one ``stat`` of that folder every ``poll_seconds`` at most;
  never a collective), each honoured once per process;
- ``signal``: ``SIGUSR2`` arrived since the last step (the handler only counts);
- ``slow_step``: the step that just ended took more than ``factor`` x the running median
  of recent steps (start of one step to the start of the next).

:class:`Budget` is a role's ``limits:``: capture cycles and bytes per process. Once spent,
no capture opens and no schedule cycle begins; the first refusal warns once and leaves a
``note`` line in the manifest.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from policy_engine.language.ranks import RankSelector
from policy_engine.language.selector import SelectorError
from policy_engine.language.triggers import Limits, Triggers
from policy_engine.plan.plan import Plan
from policy_engine.runtime import manifest
from policy_engine.runtime.state import STATE

log = logging.getLogger("policy_engine")

#: The folder under an output_dir that holds trigger requests.
REQUESTS_DIR = "triggers"
REQUEST_SUFFIX = ".json"
#: Why a capture opened, as the manifest's ``trigger`` field says.
PLAN, ON_DEMAND, SIGNAL, SLOW_STEP = "plan", "on_demand", "signal", "slow_step"
_clock = time.perf_counter
_REFRESH = 8  # measured steps between two medians


# ------------------------------------------------------------------ requests


def write_request(output_dir: str, *, role: str, ranks: str | None, step: int | None,
                  count: int) -> dict[str, Any]:
    """Ask the processes writing under ``output_dir`` to capture: ``step`` None is the
    next step each process starts. Written whole (a hidden file renamed into place), so a
    process never reads half a request. Returns the request."""
    folder = os.path.join(output_dir, REQUESTS_DIR)
    os.makedirs(folder, exist_ok=True)
    rid = f"{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(4)}"
    request = {"id": rid, "role": role, "ranks": ranks, "step": step, "count": count,
               "created": time.time(), "host": manifest.host_name(), "pid": os.getpid()}
    final = os.path.join(folder, rid + REQUEST_SUFFIX)
    hidden = os.path.join(folder, "." + rid + ".tmp")
    with open(hidden, "x", encoding="utf-8") as f:
        json.dump(request, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(hidden, final)
    return request


def _request_ids(folder: str) -> set[str]:
    try:
        names = os.listdir(folder)
    except OSError:
        return set()
    return {n[:-len(REQUEST_SUFFIX)] for n in names
            if n.endswith(REQUEST_SUFFIX) and not n.startswith(".")}


def _read_request(path: str) -> dict[str, Any] | None:
    """A request file, or None (with a warning) when it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        step, count = data.get("step"), data.get("count", 1)
        if not isinstance(data.get("role"), str) or not (
                step is None or (isinstance(step, int) and step >= 0)) or not (
                isinstance(count, int) and count >= 1):
            raise ValueError("expected role, step (null or >= 0) and count (>= 1)")
        return dict(data)
    except (OSError, ValueError) as err:
        log.warning("policy-engine: ignoring trigger request %s: %s", path, err)
        return None


# ------------------------------------------------------------------ the listener


class Listener:
    """A role's triggers in this process: which coming steps to capture, and why."""

    def __init__(self, plan: Plan, triggers: Triggers, note: Callable[..., None]) -> None:
        self.plan = plan
        self.note = note  # writes a manifest note line (RoleProfiler._note)
        #: outer step -> (why, request id or None, last step of its capture)
        self.wanted: dict[int, tuple[str, str | None, int]] = {}
        self.on_demand = triggers.on_demand
        self.signal = triggers.signal
        self.poll = triggers.poll_seconds
        self.folder = os.path.join(plan.output_dir, REQUESTS_DIR)
        # Requests older than this process are not for it (a restarted job).
        self.seen = _request_ids(self.folder) if self.on_demand else set()
        if self.on_demand:
            try:  # the folder tells `policy-engine trigger` that someone listens
                os.makedirs(self.folder, exist_ok=True)
            except OSError as err:
                log.warning("policy-engine: role %r cannot listen for trigger requests "
                            "in %s: %s", plan.role, self.folder, err.strerror or err)
        self.next_poll = 0.0
        self.mtime = -1
        self.signals = STATE.usr2_count
        slow = triggers.slow_step
        self.slow = slow
        self.slow_left = 0 if slow is None else slow.max
        self.after = 0 if slow is None else slow.after
        self.last_start = 0.0
        self.last_step = -2  # no step yet: the first one is never measured
        self.measured = 0
        self.recent: deque[float] = deque(maxlen=50 if slow is None else slow.window)
        # factor x the median of ``recent``, refreshed every few measured steps (infinite
        # until ``after`` steps are measured): a step costs a comparison, not a sort
        self.median = 0.0
        self.threshold = float("inf")

    def at_step(self, n: int, captured: bool) -> tuple[str, str | None, int] | None:
        """At the start of outer step ``n``: why to capture it beyond the plan (None: no
        reason), with the request and the last step of that capture. ``captured``: the
        previous step was inside a capture (its time says nothing about training)."""
        now = _clock()
        if self.slow_left and n == self.last_step + 1 and not captured:
            # one training step's time, and not a profiled one
            took = now - self.last_start
            if took > self.threshold:
                self._slow(n, took)
            self.recent.append(took)
            self.measured += 1
            if self.measured % _REFRESH == 0 or self.measured == self.after:
                self._refresh()
        self.last_start, self.last_step = now, n
        if self.signal and STATE.usr2_count != self.signals:
            self.signals = STATE.usr2_count
            self.wanted.setdefault(n, (SIGNAL, None, n))
        if self.on_demand and now >= self.next_poll:
            self.next_poll = now + self.poll
            self._look(n)
        if not self.wanted:
            return None
        return self.wanted.pop(n, None)

    # -- slow steps -------------------------------------------------------------
    def _slow(self, n: int, took: float) -> None:
        """Step n-1 took ``took`` seconds, past the threshold: capture step n."""
        self.slow_left -= 1
        self.wanted.setdefault(n, (SLOW_STEP, None, n))
        self.note("slow_step", step=n - 1, seconds=round(took, 6),
                  median=round(self.median, 6), captures=[n])

    def _refresh(self) -> None:
        if self.measured >= self.after and self.slow is not None:
            self.median = statistics.median(self.recent)
            self.threshold = self.slow.factor * self.median

    # -- requests ---------------------------------------------------------------
    def _look(self, n: int) -> None:
        """One stat of the requests folder; its listing only when something is new."""
        try:
            found = os.stat(self.folder)
        except OSError:
            return
        # A folder changed within the last seconds is listed again: a request written in
        # the same tick of its clock as the last listing would be missed otherwise.
        if found.st_mtime_ns == self.mtime and time.time() - found.st_mtime > 2:
            return
        self.mtime = found.st_mtime_ns
        for rid in sorted(_request_ids(self.folder) - self.seen):
            self.seen.add(rid)
            request = _read_request(os.path.join(self.folder, rid + REQUEST_SUFFIX))
            if request is not None and self._for_me(request):
                self._accept(rid, request, n)

    def _for_me(self, request: dict[str, Any]) -> bool:
        plan = self.plan
        if request["role"] != plan.role:
            return False
        raw = request.get("ranks")
        if raw is None:
            return True
        try:
            selector = RankSelector.parse(raw)
        except SelectorError as err:
            log.warning("policy-engine: trigger request %s: bad ranks %r: %s",
                        request.get("id"), raw, err.message)
            return False
        coords = dict(plan.coords, local_rank=plan.local_rank, node=plan.node)
        return selector.matches(plan.rank, plan.world, coords, {})

    def _accept(self, rid: str, request: dict[str, Any], n: int) -> None:
        first = n if request["step"] is None else request["step"]
        count = request.get("count", 1)
        last = first + count - 1
        if last < n:
            self.note("trigger", request=rid, status="missed", at=n,
                      message=f"asked for steps {first}-{last}; this process is at step {n}")
            return
        first = max(first, n)
        steps = list(range(first, last + 1))
        merged = self.plan.merge_steps
        for step in steps:
            self.wanted.setdefault(step, (ON_DEMAND, rid, last if merged else step))
        self.note("trigger", request=rid, status="accepted", at=n, captures=steps)


# ------------------------------------------------------------------ the budget


class Budget:
    """A role's ``limits`` in this process: capture cycles begun and bytes written."""

    def __init__(self, limits: Limits, note: Callable[..., None], role: str) -> None:
        self.limits = limits
        self.note = note
        self.role = role
        self.cycles = 0
        self.bytes = 0
        self.spent_why: str | None = None

    def room(self) -> bool:
        """Whether another capture cycle may begin (the first refusal warns and notes)."""
        if self.spent_why is not None:
            return False
        limits = self.limits
        if limits.captures is not None and self.cycles >= limits.captures:
            why = f"limits.captures: {limits.captures} captures recorded"
        elif limits.bytes is not None and self.bytes >= limits.bytes:
            why = f"limits.bytes: {self.bytes} bytes written (limit {limits.bytes_text})"
        else:
            return True
        self.spent_why = why
        log.warning("policy-engine: role %r reached %s: no new capture begins in this "
                    "process", self.role, why)
        self.note("limit", message=f"{why}: no new capture begins")
        return False

    def take(self) -> bool:
        """A capture cycle is about to begin: False when the budget is spent."""
        if not self.room():
            return False
        self.cycles += 1
        return True

    def wrote(self, size: int | None) -> None:
        if size:
            self.bytes += size
