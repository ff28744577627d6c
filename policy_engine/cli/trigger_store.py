"""``policy-engine trigger`` over the job's channel: find it (``--store HOST:PORT``, or the
advert a listening process wrote under ``OUTPUT_DIR/triggers/``), post a request resolved
to one step for every rank, and read the answers there (``--wait``): the ranks may write
to output folders this machine cannot see."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any

from policy_engine.cli.usage import UsageError
from policy_engine.runtime.triggers.channel import (
    JobChannel,
    KeyValue,
    agreed_step,
    connect_store,
    quiet_torch,
)
from policy_engine.runtime.triggers.deadline import (
    CALL_SECONDS,
    CONNECT_SECONDS,
    BoundedKV,
    CallThread,
    abandoned,
)
from policy_engine.runtime.triggers.folder import read_advert, read_progress
from policy_engine.runtime.triggers.requests import request_body

__all__ = ["CALL_SECONDS", "CONNECT_SECONDS", "Unanswered", "answered", "find_channel",
           "first_line", "folder_step", "leave", "post", "say", "stuck"]

_POLL = 0.5
#: Seconds one try of torch's handshake may take (a stalled one is tried again on a new
#: connection, within :data:`CONNECT_SECONDS` in all); every call after has
#: :data:`CALL_SECONDS`: a server that accepts and never answers is given up on.
_TRY_SECONDS = 4.0


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--store {text!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def stuck() -> bool:
    """Whether a store call was given up on and still blocks a thread."""
    return abandoned()


def leave(status: int) -> None:
    """End the process now, with ``status``, when a store call still blocks a thread:
    the interpreter's normal exit would tear torch's store client down under that thread
    and abort. Does nothing otherwise."""
    if stuck():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _connect(host: str, port: int) -> KeyValue:
    """A bounded client of the store: a plain connection first (a closed port or an
    unknown host fails here at once), then torch's, within :data:`CONNECT_SECONDS`. A
    handshake that stalls is tried again on a new connection (a busy store sometimes
    leaves one unanswered) until the time is up."""
    # this command's stderr says one line per failure, whatever the shell exports
    quiet_torch(force=True)
    # imported here, not on the bounded thread: on a busy machine torch's import alone can
    # take longer than a store's answer may
    import torch.distributed  # noqa: F401

    deadline = time.monotonic() + CONNECT_SECONDS
    try:
        socket.create_connection((host, port), timeout=CONNECT_SECONDS).close()
    except socket.gaierror as err:
        raise ConnectionError(f"cannot resolve {host} ({err.strerror or err})") from None
    except OSError as err:
        raise ConnectionError(err.strerror or str(err) or type(err).__name__) from None
    while True:
        left = deadline - time.monotonic()
        calls = CallThread(CALL_SECONDS)  # a new one each try: a stalled one is given up
        try:
            kv = calls.call(connect_store, host, port, _TRY_SECONDS,
                            seconds=min(left, _TRY_SECONDS))
        except Exception as err:
            timed_out = isinstance(err, TimeoutError) or "timed out" in str(err)
            if timed_out and deadline - time.monotonic() > 1.0:
                continue
            if timed_out:
                raise TimeoutError(f"no answer within {CONNECT_SECONDS:.0f} s") from None
            raise
        return BoundedKV(kv, calls)


class Unanswered:
    """The store a job advertised, which did not answer this command: the request goes
    to the folder, where a process reads it once its own calls to the store have failed
    too (a job that ended or lost its store, or one that hangs)."""

    def __init__(self, where: str, why: str) -> None:
        self.where, self.why = where, why

    def fell_back(self, output_dir: str) -> str:
        """What the command did, and when the processes see it."""
        return (f"the job's store at {self.where} (from {output_dir}/triggers/channel) does "
                f"not answer ({self.why}); the request goes under triggers/ instead, where "
                f"a process reads it only once its own calls to that store have failed "
                f"too (each is given up after {CALL_SECONDS:g} s): a process that still "
                "reaches the store does not read it (if only this machine cannot reach "
                "the store, use --store HOST:PORT with an address that does)")

    def unanswered(self) -> str:
        """Why no process answered the request in the folder (``--wait``)."""
        return (f"the processes read triggers/ only once their calls to the job's store at "
                f"{self.where} have failed (each is given up after {CALL_SECONDS:g} s); "
                "a process that still reaches it never reads the request")


def find_channel(output_dir: str, store: str | None,
                 role: str) -> tuple[str, JobChannel] | Unanswered | None:
    """The job's channel (``(where, channel)``), None when the job has none (the folder),
    :class:`Unanswered` when the store it advertised does not answer (the folder too)."""
    advertised = store is None
    if store is None:
        advert = read_advert(output_dir)
        if advert is None:
            return None
        if advert["kind"] == "ray":
            from policy_engine.runtime.triggers.ray_actor import actor_kv

            try:
                return "ray", JobChannel(actor_kv(), role)
            except Exception as err:
                raise UsageError(f"cannot reach the job's Ray actor: {err}") from None
        store = advert["where"]
    host, port = _address(store)
    try:
        kv = _connect(host, port)
    except Exception as err:
        if advertised:
            return Unanswered(f"{host}:{port}", _first_line(err))
        raise UsageError(f"cannot reach the job's store at {host}:{port}: "
                         f"{_first_line(err)}") from None
    return f"{host}:{port}", JobChannel(kv, role)


def first_line(err: BaseException) -> str:
    """An error's first line, short, for a message."""
    return _first_line(err)


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]


def folder_step(output_dir: str, role: str) -> int | None:
    """"next" in a job without a store: the step every rank can reach, from the progress
    files its processes write (None: none, each process takes its own next step)."""
    return agreed_step(read_progress(output_dir, role), time.time(), 0.0)


def post(found: tuple[str, JobChannel], *, role: str, ranks: Any, step: int | None,
         count: int) -> tuple[dict[str, Any], int]:
    """Post the request on the job's channel; the request and how many listen."""
    where, job = found
    try:
        listeners = job.listeners()
        if not listeners:
            raise UsageError(f"no process of role {role!r} listens on the job's store at "
                             f"{where} (a role listens with triggers: {{on_demand: true}})")
        if step is None:
            step = agreed_step(job.reports(), time.time(), 0.0)
        request, body = request_body(role=role, ranks=ranks, step=step, count=count)
        job.post(body)
    except (UsageError, ValueError):
        raise
    except Exception as err:
        raise UsageError(f"the job's store at {where} failed: {_first_line(err)}") from None
    return request, listeners


def say(answer: Mapping[str, Any]) -> str:
    """One answer (a manifest note or a store answer) as the line `--wait` prints."""
    what = answer.get("message")
    if answer.get("status") == "accepted":
        first, last = answer.get("first"), answer.get("last")
        steps = f"step {first}" if first == last else f"steps {first}-{last}"
        what = f"captures {steps}" + (f" ({what})" if what else "")
    return f"rank {answer.get('rank')} (pid {answer.get('pid')}): {answer.get('status')}: {what}"


def answered(found: tuple[str, JobChannel], rid: str, listeners: int,
             seconds: float) -> tuple[int, set[Any]]:
    """Print the answers on the channel ``found`` (``(where, channel)``) until every
    listener has answered or ``seconds`` pass; exit status (1: some did not answer, or the
    store went away: one line says where and why) and the ``(host, pid)`` of those shown."""
    where, job = found
    deadline = time.monotonic() + seconds
    got: dict[int, dict[str, Any]] = {}
    while True:
        try:
            answers = job.answers(rid, listeners)
        except Exception as err:
            print(f"policy-engine trigger: error: the job's store at {where} stopped "
                  f"answering after {len(got)} of {listeners} answer(s): "
                  f"{_first_line(err)}", file=sys.stderr)
            return 1, {(a.get("host"), a.get("pid")) for a in got.values()}
        for slot, answer in sorted(answers.items()):
            if slot in got:
                continue
            got[slot] = answer
            if answer.get("status") != "not_selected":
                print(say(answer), flush=True)
        if len(got) >= listeners or time.monotonic() >= deadline:
            break
        time.sleep(_POLL)
    shown = {(a.get("host"), a.get("pid")) for a in got.values()}
    if len(got) < listeners:
        print(f"policy-engine trigger: {listeners - len(got)} of the {listeners} listening "
              f"processes did not answer within {seconds:g} s", file=sys.stderr)
        return 1, shown
    return 0, shown
