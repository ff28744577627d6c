"""The channel under Ray without torch.distributed: the named actor holds the channel's
keys, every listener reaches the same one by name, on a local Ray cluster."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from dist_scripts.ray_start import start_ray

from policy_engine import Topology, apply_policy
from policy_engine.analysis.manifests import scan_manifests
from policy_engine.runtime.triggers.channel import PREFIX, JobChannel, Refused, agreed_step
from policy_engine.runtime.triggers.folder import read_advert
from policy_engine.runtime.triggers.requests import MAX_BYTES, request_body
from policy_engine.testing import recording_backend

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


class Worker:
    pass


def _listen(make_policy: Any, out: Path) -> None:
    """A rank of 2 under Ray finds the actor by itself and takes a request from it."""
    from policy_engine.runtime.triggers.ray_actor import actor_kv

    policy = make_policy(steps=[], ranks="all",
                         triggers={"on_demand": True, "poll_seconds": 0.1})
    stop = threading.Event()
    with recording_backend("torch"):
        prof = apply_policy(Worker(), "actor", policy, Topology(rank=1, world=2))

        def train() -> None:
            n = 0
            while not stop.is_set():
                with prof.training_step(n):
                    time.sleep(0.02)
                n += 1
            prof.close()
        thread = threading.Thread(target=train)
        thread.start()
        try:
            job = JobChannel(actor_kv(), "actor")
            deadline = time.monotonic() + 120
            # (a slot holds its process's first report once it has one)
            while not (job.listeners() == 1 and
                       [r for r in job.reports() if isinstance(r, dict) and "step" in r]):
                assert time.monotonic() < deadline
                time.sleep(0.1)
            # the listener said where the channel is before it listened there
            assert read_advert(str(out)) == {"kind": "ray", "where": "policy_engine_triggers"}
            # A loaded machine may reach the request's step before the listener sees it
            # (the answer says "missed"): then a request for a later step.
            for _ in range(5):
                request, body = request_body(
                    role="actor", ranks=None,
                    step=agreed_step(job.reports(), time.time(), 0.0), count=1)
                job.post(body)
                missed = None
                while missed is None:
                    records = scan_manifests(str(out)).records
                    if [r for r in records if r["event"] == "open"]:
                        break
                    if [r for r in records if r["event"] == "note"
                            and r.get("request") == request["id"]
                            and r.get("status") == "missed"]:
                        missed = request["id"]
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
                if missed is None:
                    break
            else:
                raise AssertionError("five requests in a row were missed")
        finally:
            stop.set()
            thread.join(30)
    notes = [r for r in scan_manifests(str(out)).records
             if r["event"] == "note" and r.get("note") == "trigger"]
    assert [(n["status"], n["rank"]) for n in notes if n["status"] != "missed"] == \
        [("accepted", 1)]


def test_the_named_actor_carries_requests_progress_and_answers(make_policy: Any,
                                                               tmp_path: Path) -> None:
    from policy_engine.runtime.triggers.ray_actor import NAMESPACE, actor_kv

    start_ray(num_cpus=1, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False)
    try:
        _listen(make_policy, tmp_path / "out")
        # the actor outlives the listener that created it (Ray would remove it with the
        # creator's handle): the ended listener's slot is still there
        assert JobChannel(actor_kv(), "actor").listeners() == 1
        first, second = JobChannel(actor_kv(), "kv"), JobChannel(actor_kv(), "kv")
        slots = [first.register(b'{"who": 1}'), second.register(b'{"who": 2}')]
        assert slots == [0, 1] and second.listeners() == 2  # one actor, found by name
        first.publish(0, {"step": 10, "time": 100.0, "rate": 2.0, "poll": 1.0})
        second.publish(1, {"step": 12, "time": 100.0, "rate": 2.0, "poll": 1.0})
        step = agreed_step(first.reports(), 100.0, 0.0)
        assert step == 12 + 6 + 2
        start = second.cursor()
        request, body = request_body(role="kv", ranks=None, step=step, count=1)
        first.post(body)
        data = second.request(start) or b"{}"
        rid = json.loads(data)["id"]
        assert rid == request["id"] and json.loads(data)["step"] == step
        assert second.request(start + 1) is None
        assert first.claim_signal(30, 12) and not second.claim_signal(31, 12)
        second.answer(rid, 1, {"status": "accepted", "rank": 1})
        assert first.answers(rid, 2) == {1: {"status": "accepted", "rank": 1}}
    finally:
        ray.shutdown()


_CREATOR = """
import sys
from policy_engine.runtime.triggers.channel import JobChannel
from policy_engine.runtime.triggers.ray_actor import actor_kv
kv = actor_kv()  # joins the test's cluster and creates the actor
JobChannel(kv, "solo").register(b'{"who": "creator"}')
del kv  # its listener ends; the process goes on
print("ready", flush=True)
sys.stdin.read()  # until the test lets it exit
"""


def test_the_actor_lives_as_long_as_the_process_that_created_it(tmp_path: Path) -> None:
    """Across real processes: another process creates the actor and lets go of its
    listener; the actor stays while that process runs, and once it exits the next
    listener gets a new actor instead of the dying one."""
    import subprocess
    import sys

    from policy_engine.runtime.triggers.ray_actor import NAMESPACE, actor_kv

    start_ray(num_cpus=1, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False)
    creator = subprocess.Popen([sys.executable, "-c", _CREATOR], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert creator.stdout is not None and creator.stdout.readline() == "ready\n"
        assert JobChannel(actor_kv(), "solo").listeners() == 1  # still there
        assert creator.stdin is not None
        creator.stdin.close()
        assert creator.wait(60) == 0
        assert JobChannel(actor_kv(), "solo").listeners() == 0  # a new one
    finally:
        creator.kill()
        ray.shutdown()


def _each(calls: list[Any], batch: int = 4000) -> list[Any]:
    """Ray calls made many at a time (as anyone on the cluster may), in batches that Ray
    does not warn about; what each answered."""
    found: list[Any] = []
    for at in range(0, len(calls), batch):
        found += ray.get([method.remote(*args) for method, *args in calls[at:at + batch]])
    return found


def test_the_actor_holds_no_more_than_a_store_channel_reader_keeps(
        make_policy: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Any process on the cluster may call the actor: values longer than a request are
    refused (a 200 MiB one too), a flood of keys leaves it at its caps (the oldest
    answers make room), and once junk fills it a write is refused with a clear error,
    and a listener that cannot register there listens to the folder, with one warning."""
    from policy_engine.runtime.triggers.ray_actor import MAX_HELD, MAX_KEYS, NAMESPACE, actor_kv

    start_ray(num_cpus=1, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False)
    try:
        kv = actor_kv()
        for size in (MAX_BYTES + 1, 16 << 10, 200 << 20):
            with pytest.raises(Refused, match=f"a value is at most {MAX_BYTES} bytes, not "
                                              f"{size}"):
                kv.set(f"{PREFIX}junk/{size}", b"x" * size)
        with pytest.raises(Refused, match="a value is at most"):
            kv.compare_set(f"{PREFIX}junk/cas", b"", b"x" * (MAX_BYTES + 1))
        assert kv.usage()["keys"] == 0  # none of them stored

        answers = [(kv.actor.set, f"{PREFIX}answer/flood-{i}/0", b"{}")
                   for i in range(MAX_KEYS + 1000)]
        assert set(_each(answers)) == {None}  # every one taken: the oldest made room
        assert kv.usage()["keys"] == MAX_KEYS
        job = JobChannel(kv, "actor")
        job.register(b'{"who": "a listener"}')  # a new key: an answer made room
        assert not kv.has(f"{PREFIX}answer/flood-1000/0")
        assert kv.has(f"{PREFIX}answer/flood-{MAX_KEYS + 999}/0")

        junk = [(kv.actor.set, f"{PREFIX}junk/{i}", b"x" * MAX_BYTES)
                for i in range(MAX_HELD // MAX_BYTES + 100)]
        refused = [said for said in _each(junk) if said is not None]
        assert refused and all("the most it may" in said for said in refused)
        for i in range(MAX_BYTES):  # the last bytes, until not even a small value fits
            if ray.get(kv.actor.set.remote(f"{PREFIX}junk/small-{i}", b"x" * 64)):
                break
        usage = kv.usage()  # (and so no poll of a listener can fetch more)
        assert usage["keys"] <= MAX_KEYS and MAX_HELD - 200 <= usage["bytes"] <= MAX_HELD
        _, body = request_body(role="actor", ranks=None, step=5, count=1)
        with pytest.raises(Refused, match="the most it may"):
            job.post(body)  # the one who posts is told

        policy = make_policy(steps=[], ranks="all",
                             triggers={"on_demand": True, "poll_seconds": 60})
        with recording_backend("torch"), caplog.at_level(logging.WARNING, "policy_engine"):
            prof = apply_policy(Worker(), "actor", policy, Topology(rank=1, world=2))
            try:
                thread = prof._listener.thread  # type: ignore[union-attr]
                assert thread.poll_now(60) and thread.poll_now(60)
                assert not thread.live
            finally:
                prof.close()
        gone = [r.getMessage() for r in caplog.records if "refused a write" in r.getMessage()]
        assert len(gone) == 1 and "trigger requests now come through" in gone[0], gone
    finally:
        ray.shutdown()
