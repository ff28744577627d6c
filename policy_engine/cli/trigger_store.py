"""``policy-engine trigger`` over the job's channel: find it (``--store HOST:PORT``, or the
advert a listening process wrote under ``OUTPUT_DIR/triggers/``), post a request resolved
to one step for every rank, and read the answers there (``--wait``): the ranks may write
to output folders this machine cannot see."""

from __future__ import annotations

import sys
import time
from typing import Any

from policy_engine.cli.usage import UsageError
from policy_engine.runtime.channel import JobChannel, agreed_step, connect_store
from policy_engine.runtime.channel_folder import read_advert, read_progress
from policy_engine.runtime.requests import request_body

__all__ = ["answered", "find_channel", "folder_step", "post", "say"]

_POLL = 0.5


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--store {text!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def find_channel(output_dir: str, store: str | None, role: str) -> tuple[str, JobChannel] | None:
    """The job's channel (``(where, channel)``), None when the job has none (the folder).
    An advertised store that does not answer is a job that ended or lost it: its
    processes listen to the folder then, so the request goes there."""
    advertised = store is None
    if store is None:
        advert = read_advert(output_dir)
        if advert is None:
            return None
        if advert["kind"] == "ray":
            from policy_engine.runtime.channel_ray import actor_kv

            try:
                return "ray", JobChannel(actor_kv(), role)
            except Exception as err:
                raise UsageError(f"cannot reach the job's Ray actor: {err}") from None
        store = advert["where"]
    host, port = _address(store)
    try:
        kv = connect_store(host, port, timeout=5.0)
    except Exception as err:
        if advertised:
            print(f"policy-engine trigger: the job's store at {host}:{port} (from "
                  f"{output_dir}/triggers/channel) does not answer ({_first_line(err)}); "
                  "writing the request under triggers/ instead", file=sys.stderr)
            return None
        raise UsageError(f"cannot reach the job's store at {host}:{port}: "
                         f"{_first_line(err)}") from None
    return f"{host}:{port}", JobChannel(kv, role)


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
        raise UsageError(f"the job's store at {where} failed: {err}") from None
    return request, listeners


def say(answer: dict[str, Any]) -> str:
    """One answer (a manifest note or a store answer) as the line `--wait` prints."""
    what = answer.get("message")
    if answer.get("status") == "accepted":
        first, last = answer.get("first"), answer.get("last")
        steps = f"step {first}" if first == last else f"steps {first}-{last}"
        what = f"captures {steps}" + (f" ({what})" if what else "")
    return f"rank {answer.get('rank')} (pid {answer.get('pid')}): {answer.get('status')}: {what}"


def answered(job: JobChannel, rid: str, listeners: int, seconds: float) -> tuple[int, set[Any]]:
    """Print the answers on the channel until every listener has answered or ``seconds``
    pass; exit status (1: some did not answer) and the ``(host, pid)`` of those shown."""
    deadline = time.monotonic() + seconds
    got: list[dict[str, Any]] = []
    while True:
        try:
            found = job.answers(rid, len(got))
        except Exception as err:
            print(f"policy-engine trigger: the job's store stopped answering: {err}",
                  file=sys.stderr)
            break
        for answer in found:
            if not isinstance(answer, dict):
                break  # counted, not written yet: read again
            got.append(answer)
            if answer.get("status") != "not_selected":
                print(say(answer), flush=True)
        if len(got) >= listeners or time.monotonic() >= deadline:
            break
        time.sleep(_POLL)
    shown = {(a.get("host"), a.get("pid")) for a in got}
    if len(got) < listeners:
        print(f"policy-engine trigger: {listeners - len(got)} of the {listeners} listening "
              f"processes did not answer within {seconds:g} s", file=sys.stderr)
        return 1, shown
    return 0, shown
