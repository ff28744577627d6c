"""The listener thread of a role's triggers: it reads every trigger request, and makes
every network call and file write of the channel, never the training thread.

The training thread (:class:`~policy_engine.runtime.triggers.step_triggers.StepTriggers`)
hands it two numbers per step, the step and its clock (two attribute writes), and, rarely,
a message through the outbox: an answer, or a request of the whole job to post (a slow
step). Every ``poll_seconds`` the thread reads the new requests of its role on the
channel, checks them and queues them in the inbox, where the training thread takes them at
its next step boundary; in a job it also publishes the process's progress, posts a
request for a SIGUSR2 the process got, and writes the answers.

The channel is one of three transports: the job's c10d store when torch.distributed is
initialised (torchrun, Megatron, verl's workers), a named Ray actor under Ray without it
(:mod:`~policy_engine.runtime.triggers.pick`), else the ``triggers/`` folder
(:mod:`~policy_engine.runtime.triggers.folder`: request files, and progress files beside
them). A process alone (world 1, ``channel: auto``) has no job to reach: its thread reads
the folder only. Every call to the job's channel has a deadline
(:mod:`~policy_engine.runtime.triggers.deadline`): a store that fails, or stops answering
without closing its connection, turns the job's channel off with one warning, and the
folder takes over.

With ``triggers.stall`` the thread also watches the training thread's step, and writes the
process's stall record when it runs past its limit
(:mod:`~policy_engine.runtime.triggers.stall_watch`): it runs while the training thread is
blocked.

In a job the thread also keeps the job's clock (:mod:`~policy_engine.runtime.triggers.clock`):
the first listener of a process that may reach the job's channel measures the process's
offset to rank 0's clock (on rank 0: answers the others, between its polls). A role
without a listener of its triggers, in a job of several ranks, gets one for the clock
alone (``requests=False``: it reads no request and publishes no progress).
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import secrets
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs

from policy_engine.language.values.triggers import Triggers
from policy_engine.plan.plan import Plan
from policy_engine.runtime.process.state import STATE, claim_clock, release_clock, warn_once
from policy_engine.runtime.triggers import clock
from policy_engine.runtime.triggers import folder as channel_folder
from policy_engine.runtime.triggers.channel import JobChannel, Refused, agreed_step
from policy_engine.runtime.triggers.deadline import (
    CALL_SECONDS,
    CONNECT_SECONDS,
    BoundedKV,
    CallThread,
)
from policy_engine.runtime.triggers.messages import Answer, Arrived, NotARequest, Post
from policy_engine.runtime.triggers.pick import pick_channel
from policy_engine.runtime.triggers.requests import (
    MAX_BYTES,
    BadRequest,
    parse_request,
    request_body,
)
from policy_engine.runtime.triggers.stall_watch import StallWatch

__all__ = ["BYTES_PER_POLL", "MAX_BEHIND", "MAX_INBOX", "MAX_OUTBOX", "READS_PER_POLL",
           "REPUBLISH", "ListenerThread"]

log = logging.getLogger("policy_engine")
#: Request keys looked at in one poll, at most, and bytes fetched (a value longer than a
#: request is dropped as soon as it is read; the budget bounds what one poll moves).
READS_PER_POLL = 128
BYTES_PER_POLL = 16 << 20
#: How far behind the list's end a listener may fall (a flood is skipped, not read
#: through: the last this many are read).
MAX_BEHIND = 256
#: Requests read and not yet taken by the training thread, at most: past it, the
#: listener leaves the rest where they are (the store, the folder) until a later poll.
MAX_INBOX = 64
#: Answers waiting to be written, at most (the oldest are dropped past it).
MAX_OUTBOX = 1024
#: Seconds between two reports of a process whose step does not move.
REPUBLISH = 10.0
#: The shortest time between two polls (``poll_seconds: 0`` polls this often).
MIN_POLL = 0.05
#: Seconds the interpreter's exit waits, in all, for the listeners' threads to leave the
#: calls they are in (:func:`_at_exit`).
EXIT_WAIT = 3.0
#: The listeners of this process, for its exit.
_LIVE: weakref.WeakSet[ListenerThread] = weakref.WeakSet()


class _Pace:
    """The process's progress as its listener thread sees it: the step, when, and the
    rate measured between two polls."""

    __slots__ = ("rate", "sent", "step", "when")

    def __init__(self) -> None:
        self.step, self.when, self.rate = -1, 0.0, 0.0
        self.sent = (-1, 0.0)  # the step last published, and when

    def due(self, step: int) -> bool:
        """Whether to publish now: the step moved, or a while passed (a live process)."""
        last, when = self.sent
        now = time.monotonic()
        if step < 0 or (step == last and now - when < REPUBLISH):
            return False
        self.sent = (step, now)
        return True

    def sample(self, step: int, stamp: float) -> dict[str, Any] | None:
        """The report to publish for the training thread's last step (None: no step
        yet). ``stamp`` is its ``perf_counter``: turned into wall-clock time here."""
        if step < 0:
            return None
        when = time.time() - max(0.0, time.perf_counter() - stamp)
        if self.step >= 0 and when > self.when and step >= self.step:
            measured = (step - self.step) / (when - self.when)
            self.rate = measured if not self.rate else 0.5 * self.rate + 0.5 * measured
        self.step, self.when = step, when
        return {"step": step, "time": when, "rate": round(self.rate, 6)}

    def peek(self, step: int, stamp: float) -> dict[str, Any] | None:
        """The report :meth:`sample` would give, leaving the measured rate as it is."""
        if step < 0:
            return None
        when = time.time() - max(0.0, time.perf_counter() - stamp)
        return {"step": step, "time": when, "rate": round(self.rate, 6)}


class _Link:
    """The job's channel this process is on now (store or Ray), or none: the folder."""

    __slots__ = ("calls", "channel", "cursor", "gone", "kind", "slot", "where")

    def __init__(self) -> None:
        self.channel: JobChannel | None = None
        self.calls: CallThread | None = None  # makes every call to it, within a deadline
        self.kind = "folder"
        self.where = ""
        self.slot = -1
        self.cursor = 0
        self.gone = False  # the job's channel failed: the folder from now on

    def close(self) -> None:
        """Done with the job's channel: its call thread ends (unless a call hangs it)."""
        if self.calls is not None:
            self.calls.close()
        self.channel, self.calls = None, None


class _Polls:
    """Polls asked for and polls done, so that a caller can wait for one that began after
    it asked (:meth:`ListenerThread.poll_now`)."""

    __slots__ = ("asked", "done", "finished", "wake")

    def __init__(self) -> None:
        self.asked = 0  # the last poll asked for
        self.done = 0  # the last poll asked for before a poll that has ended began
        self.finished = threading.Condition()
        self.wake = threading.Event()  # set: poll now (or stop)


class ListenerThread:
    """A role's listener thread, and the inbox and outbox between it and the training
    thread. ``job``: the role's triggers concern the job (more than one rank, or a channel
    chosen): the thread looks for the job's channel, publishes the process's progress,
    and posts requests of the whole role (a signal, a slow step)."""

    def __init__(self, plan: Plan, triggers: Triggers, *, job: bool, requests: bool = True,
                 note: Callable[..., None] | None = None,
                 where: Callable[[], dict[str, Any]] | None = None) -> None:
        self.step = -1  # written by the training thread at every step
        self.stamp = 0.0
        self.trainer = 0  # the ident of the thread that runs the steps (the first one seen)
        # for the stall watch (triggers.stall): the step that ended last, written by the
        # training thread at its end; while a stall is open, when that was
        self.done = -1
        self.stalled = False
        self.ended = 0.0
        self.watch = None if triggers.stall is None else StallWatch(
            plan, triggers.stall, note or (lambda kind, **fields: None), where)
        self.inbox: deque[Arrived | NotARequest] = deque()  # at most MAX_INBOX
        self.outbox: deque[Answer | Post] = deque(maxlen=MAX_OUTBOX)
        self.live = False  # the job's channel carries the requests (the folder is not read)
        self.written = -1  # the step the progress file under triggers/ says
        self.hurry = False  # requests wait to be read: poll again soon
        self.plan = plan
        self.triggers = triggers
        self.job = job
        # in a job, a SIGUSR2 is a request of the whole role, which this thread posts
        self.signals = STATE.hooks.usr2_count if job and triggers.signal else None
        self.link = _Link()
        self.pace = _Pace()
        self.folder = channel_folder.RequestFolder(plan.output_dir)
        if requests:  # (the folder tells `policy-engine trigger` that someone listens)
            self.folder.start(plan.role)  # before training starts: what is there is old
        self.polls = _Polls()
        self.stopped = False
        self.requests = requests  # False: the job's clock alone
        # the process's clock keeper, when this listener is it (the first of a job's)
        self.keeper: clock.Keeper | None = None
        if job and note is not None and triggers.channel != "folder":
            wake = self.polls.wake.set
            self.keeper = claim_clock(lambda: clock.Keeper(plan.rank, note, wake))
        thread = threading.Thread(target=_run, args=(weakref.ref(self), self.polls),
                                  name=f"policy-engine-listener-{plan.role}", daemon=True)
        self._thread = thread
        _LIVE.add(self)
        thread.start()

    def close(self) -> None:
        """Stop the thread (at the end of the poll under way, if one is)."""
        self.stopped = True
        self._let_go()
        self.polls.wake.set()
        with self.polls.finished:
            self.polls.finished.notify_all()

    def poll_now(self, timeout: float = 30.0) -> bool:
        """Wake the thread and wait until it has ended a poll that began after this call:
        whatever was written to the channel before the call is then in the inbox (up to
        the bounds of one poll). False when the thread stopped, or at the timeout."""
        polls = self.polls
        with polls.finished:
            polls.asked += 1
            asked = polls.asked
            polls.wake.set()
            return polls.finished.wait_for(
                lambda: polls.done >= asked or self.stopped, timeout) and not self.stopped

    def _let_go(self) -> None:
        """This listener keeps the process's clock no more."""
        if self.keeper is not None:
            release_clock(self.keeper)
        self.keeper = None

    def idle(self, seconds: float) -> None:
        """Between two polls: rank 0's clock keeper answers the others' rings (until the
        next poll, or until woken); any other listener waits."""
        keeper, channel = self.keeper, self.link.channel
        if keeper is not None and keeper.serves and channel is not None and not self.stopped:
            try:
                clock.serve(channel.kv, self.plan.rank, seconds, self.polls.wake.is_set)
                return
            except Exception as err:  # the store went away, or answers nonsense
                self._drop(err)
        self.polls.wake.wait(seconds)

    def interval(self) -> float:
        wait = max(self.triggers.poll_seconds, MIN_POLL)
        wait = wait / 4 if self.hurry else wait
        if self.watch is not None:  # wake as the step under way passes its stall limit
            due = self.watch.wait(self.step, self.stamp, self.done)
            if due is not None:
                wait = min(wait, due + 0.01)
        return wait

    # -- one poll ------------------------------------------------------------------
    def tick(self) -> None:
        """One poll: the job's channel when there is one, else the folder."""
        self.hurry = False
        if self.watch is not None:
            self._watch_tick(self.watch)
        if not self.job:
            self._read_folder()
            return
        link = self.link
        if link.channel is None and not link.gone:
            try:
                self._connect()
            except Exception as err:  # no store at MASTER_ADDR:MASTER_PORT after all
                self._drop(err, "could not be reached")
        if not self.requests:  # the job's clock alone
            try:
                if link.channel is not None and self.keeper is not None:
                    self.keeper.tick(link.channel.kv, link.kind)
            except Exception as err:
                self._drop(err)
            return
        report = self.pace.sample(self.step, self.stamp) if self.pace.due(self.step) \
            else None
        if self.signals is not None and STATE.hooks.usr2_count != self.signals:
            self.signals = STATE.hooks.usr2_count
            self.outbox.append(Post("signal"))
        try:
            if link.channel is not None:
                self._job_tick(link.channel, report)
                if self.keeper is not None:
                    self.keeper.tick(link.channel.kv, link.kind)
                return
        except Exception as err:  # the store went away, or answers nonsense
            self._drop(err)
        self._folder_tick(report)

    def finish(self) -> None:
        """The thread's last work: the stall watch's last word, and the channel let go."""
        watch = self.watch
        try:
            if watch is not None:
                watch.finish(self.step, self.stamp, self.done, self.ended)
        except Exception as err:
            warn_once(("stall-watch", self.plan.role, type(err).__name__),
                      "policy-engine: role %r: the stall watch failed (%s: %s)",
                      self.plan.role, type(err).__name__, err)
        self.link.close()

    def _watch_tick(self, watch: StallWatch) -> None:
        """The stall watch's own part of a poll: nothing in it waits for the channel."""
        try:
            watch.local(self.step, self.stamp, self.done, self.ended, self.trainer, self.job)
        except Exception as err:
            warn_once(("stall-watch", self.plan.role, type(err).__name__),
                      "policy-engine: role %r: the stall watch failed (%s: %s); training "
                      "goes on", self.plan.role, type(err).__name__, err)
        self.stalled = watch.open is not None

    def _connect(self) -> None:
        found = pick_channel(self.triggers.channel)
        if found is None:
            return
        link = self.link
        link.kind, link.where, connect = found
        # every call to the channel on a thread of its own, waited for within a deadline:
        # a store that hangs (SIGSTOP, a hung node) would hold this thread for ever
        link.calls = CallThread(CALL_SECONDS, f"policy-engine-channel-{self.plan.role}")
        channel = JobChannel(BoundedKV(link.calls.call(connect, seconds=CONNECT_SECONDS),
                                       link.calls), self.plan.role)
        if not self.requests:  # the clock needs no advert, no slot and no cursor
            link.channel = channel
            return
        try:  # where `policy-engine trigger` finds the channel: written before this
            # process listens there, so that a command that reads no advert yet finds
            # this process still reading the folder
            channel_folder.advertise(self.plan.output_dir, link.kind, link.where)
        except OSError as err:
            warn_once(("advert", self.plan.output_dir), "policy-engine: cannot tell %s "
                      "where the job's %s is (%s): `policy-engine trigger` needs --store",
                      self.plan.output_dir, link.kind, err.strerror or err)
        link.slot = channel.register(json.dumps(
            {"rank": self.plan.rank, "pid": os.getpid(), "token": secrets.token_hex(8)}
        ).encode())
        link.cursor = channel.cursor()  # requests older than this process are not for it
        link.channel = channel
        self.live = True

    def _drop(self, err: BaseException, what: str = "stopped answering") -> None:
        """The job's channel is off for this process from now on: one warning."""
        if isinstance(err, Refused):  # the Ray actor is full
            what = "refused a write"
        link = self.link
        subject = f"the job's {link.kind} at {link.where}" if link.where \
            else "the job's channel"
        said = (str(err).strip().splitlines() or [""])[0][:200]
        if self.requests:
            warn_once(("channel-gone", self.plan.role),
                      "policy-engine: role %r: %s %s (%s: %s); trigger requests now come "
                      "through %s", self.plan.role, subject, what, type(err).__name__, said,
                      self.folder.path)
        else:
            warn_once(("channel-gone", self.plan.role),
                      "policy-engine: role %r: %s %s (%s: %s); the job's clock is not "
                      "measured from now on", self.plan.role, subject, what,
                      type(err).__name__, said)
        if self.keeper is not None:
            self.keeper.failures = clock.GIVE_UP  # no channel: no more measurements
        link.close()
        link.gone, self.live = True, False

    def _job_tick(self, channel: JobChannel, report: dict[str, Any] | None) -> None:
        link = self.link
        if report is not None:
            channel.publish(link.slot, self._report(report))
        hint = channel.hint()[0]
        if hint is not None and hint - link.cursor > MAX_BEHIND:
            warn_once(("channel-behind", self.plan.role), "policy-engine: role %r: %s "
                      "requests arrived at once on the job's %s; reading the last %s",
                      self.plan.role, hint - link.cursor, link.kind, MAX_BEHIND)
            link.cursor = hint - MAX_BEHIND
        fetched, reports = 0, _Lazy(channel)
        for _ in range(READS_PER_POLL):
            if len(self.inbox) >= MAX_INBOX or fetched > BYTES_PER_POLL:
                self.hurry = True
                break
            data = channel.request(link.cursor)
            if data is None:
                if hint is None or link.cursor >= hint:
                    break  # the end of the list
                link.cursor += 1  # a hole below where writers have written: skipped
                continue
            fetched += len(data)
            # a longer value is refused as too long: what is kept is a request's size
            item = self._read(channel, link.cursor, data[:MAX_BYTES + 1], reports)
            del data
            link.cursor += 1
            if item is not None:
                self.inbox.append(item)
        self._drain(channel, reports)
        if self.watch is not None:
            self.watch.on_store(channel, link.kind, self.step, self.stamp, self.done,
                                self.trainer)

    def _read(self, channel: JobChannel, index: int, data: bytes,
              reports: _Lazy) -> Arrived | NotARequest | None:
        """Request ``index`` as the training thread takes it: checked here, on this
        thread; None when it is another role's. A request without a step gets the one
        step every listener agrees on (the first listener's proposal)."""
        where = f"key {channel.request_key(index)} of the job's {self.link.kind} at " \
                f"{self.link.where}"
        name = f"store-request-{index}"
        try:
            request = parse_request(name, data, own_id=True)
        except BadRequest as bad:
            return NotARequest(name, bad.message, where)
        if request.role != self.plan.role:
            return None
        if request.step is None:
            step = channel.agree(index, self._target(reports.get()))
            if step is None:
                return NotARequest(request.id, "the step agreed for it in the store is not a "
                               "step number", where)
            request = attrs.evolve(request, step=step)
        return Arrived(request, where)

    def _target(self, reports: list[Any]) -> int:
        """The step a request made now asks every listener of the role for."""
        mine = self.pace.peek(self.step, self.stamp)
        target = agreed_step([*reports, mine], time.time(), self.triggers.poll_seconds)
        at = max(self.step, 0)
        if target is None or target <= at:
            target = at + math.ceil(2 * self.triggers.poll_seconds *
                                    max(self.pace.rate, 1.0)) + 2
        return target

    def _folder_tick(self, report: dict[str, Any] | None) -> None:
        plan = self.plan
        # written when the step moved: the file already says the step, its time and rate
        # (a republish of the same step would only rewrite it, on every rank)
        if report is not None and report["step"] != self.written:
            channel_folder.publish_progress(plan.output_dir, plan.role, plan.rank,
                                            self._report(report))
            self.written = report["step"]
        self._drain(None, None)  # this process's own posts are read back below, with the rest
        if self.watch is not None:
            self.watch.on_folder(self.step)
        self._read_folder()

    def _read_folder(self) -> None:
        """The new request files, while the inbox has room."""
        if len(self.inbox) >= MAX_INBOX:
            self.hurry = True
            return
        for item in self.folder.look():
            if isinstance(item, Arrived) and item.request.why == "stall":
                if self.watch is not None:  # asks for a record, on this thread: no step
                    self.watch.asked(item.request, self.step, self.stamp, self.done,
                                     self.trainer)
                continue
            self.inbox.append(item)
        self.hurry = self.hurry or self.folder.backlog

    def _report(self, report: dict[str, Any]) -> dict[str, Any]:
        return dict(report, rank=self.plan.rank, pid=os.getpid(),
                    poll=self.triggers.poll_seconds)

    # -- what the training thread asked for ---------------------------------------------
    def _drain(self, channel: JobChannel | None, reports: _Lazy | None) -> None:
        """What the training thread asked for; ``reports``: the role's progress on the
        job's channel, read at most once a poll."""
        while self.outbox:
            match self.outbox.popleft():
                case Answer(rid, fields):
                    if channel is not None:
                        channel.answer(rid, self.link.slot, fields)
                case Post() as ask:
                    self._post(channel, reports, ask)

    def _post(self, channel: JobChannel | None, reports: _Lazy | None, ask: Post) -> None:
        """Post a request of this process (a signal, a slow step) at the agreed step."""
        plan = self.plan
        target = self._target(reports.get() if reports is not None else
                              channel_folder.read_progress(plan.output_dir, plan.role))
        at = max(self.step, 0)
        if ask.why == "signal":
            claimed = channel.claim_signal(target, at) if channel is not None else \
                channel_folder.claim_signal(plan.output_dir, plan.role, target, at)
            if not claimed:
                return  # another rank's signal already asked for a step still ahead
        request, body = request_body(role=plan.role, ranks=ask.ranks, step=target, count=1,
                                     also=list(ask.also), why=ask.why, slow=ask.slow)
        if channel is not None:
            channel.post(body)
        else:
            channel_folder.post_request(plan.output_dir, request["id"], body)


class _Lazy:
    """The role's progress reports, read from the store once per poll when first needed."""

    __slots__ = ("channel", "found")

    def __init__(self, channel: JobChannel) -> None:
        self.channel = channel
        self.found: list[Any] | None = None

    def get(self) -> list[Any]:
        if self.found is None:
            self.found = self.channel.reports()
        return self.found


def _at_exit() -> None:
    """The interpreter exits: every listener stops, and its threads get a moment (at most
    :data:`EXIT_WAIT` seconds in all) to leave the call they are in. A thread still inside
    torch's store client when the interpreter finalises is ended where it stands, and the
    C++ frames it ends in abort the process ("terminate called without an active
    exception"). A call given up on (its store hung) is not waited for."""
    listeners = list(_LIVE)
    calls = [listener.link.calls for listener in listeners]
    for listener in listeners:
        listener.close()
    deadline = time.monotonic() + EXIT_WAIT
    for listener, call in zip(listeners, calls, strict=True):
        listener._thread.join(max(0.0, deadline - time.monotonic()))
        if call is not None and call.hung is None:
            call.close()
            call.join(deadline - time.monotonic())


atexit.register(_at_exit)  # does nothing in a process without listeners


def _run(ref: weakref.ref[ListenerThread], polls: _Polls) -> None:
    """The thread: a poll every ``poll_seconds`` (sooner when woken) until the listener is
    closed or gone. Whatever fails in a poll is warned about once per kind; the thread
    goes on."""
    while True:
        listener = ref()
        if listener is None:
            return  # its channel's call thread ends as the listener is collected
        if listener.stopped:
            listener.finish()
            return
        asked = polls.asked  # the polls asked for before this one began
        try:
            listener.tick()
        except Exception as err:
            warn_once(("listener-thread", listener.plan.role, type(err).__name__),
                      "policy-engine: role %r: the trigger listener failed on its thread "
                      "(%s: %s); training goes on, and the thread polls again",
                      listener.plan.role, type(err).__name__, err)
        with polls.finished:
            polls.done = asked
            polls.finished.notify_all()
        if listener.keeper is not None and listener.keeper.serves:
            listener.idle(listener.interval())  # rank 0 answers the clock meanwhile
        else:
            wait = listener.interval()
            del listener
            polls.wake.wait(wait)
        polls.wake.clear()
