"""The job's store as an attacker sees it: a real 2-rank torchrun job (gloo) listening with
``triggers: {on_demand: true, channel: store}``, and this test as a second process that
joins the job's TCPStore (``is_master=False``) and writes what it likes there. Every
attack ends with the channel still carrying genuine requests to both ranks. Then
``policy-engine trigger --store`` against servers that are no store at all.
"""

from __future__ import annotations

import datetime
import json
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from job_env import child_env

from policy_engine.analysis.manifests import scan_manifests
from policy_engine.runtime.triggers.channel import PREFIX, JobChannel, StoreKV

dist = pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "dist_scripts" / "store_worker.py"
TIMEOUT = 90
POLICY = """version: 1
output_dir: out
roles:
  trainer:
    enabled: true
    ranks: all
    steps: []
    torch: {activities: [cpu]}
    triggers: {on_demand: true, poll_seconds: 0.25, channel: store}
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def until(check: Any, what: str, seconds: float = TIMEOUT) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {seconds} s")


class Job:
    """A 2-rank torchrun job in ``folder``, stopped by a file; ``store`` is this
    process's own client of the job's TCPStore."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True)
        (folder / "policy.yaml").write_text(POLICY)
        self.folder = folder
        self.port = _port()
        self.output = ""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
             "--nproc-per-node=2", "--master-addr=127.0.0.1", f"--master-port={self.port}",
             str(WORKER), "policy.yaml"],
            cwd=folder, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        self.store: Any = None
        self.channel = until(self._listening, "2 ranks listening on the store")

    def _listening(self) -> JobChannel | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"the job ended: {self.proc.communicate()[0][-3000:]}")
        try:
            if self.store is None:
                self.store = dist.TCPStore("127.0.0.1", self.port, is_master=False,
                                           wait_for_workers=False,
                                           timeout=datetime.timedelta(seconds=10))
            channel = JobChannel(StoreKV(self.store), "trainer")
            reports = [r for r in channel.reports() if isinstance(r, dict) and "step" in r]
        except Exception:
            return None
        return channel if len(reports) == 2 else None

    def trigger(self, *args: str) -> tuple[int, str]:
        done = subprocess.run([sys.executable, "-m", "policy_engine", "trigger", "out",
                               "--role", "trainer", *args], cwd=self.folder, env=child_env(),
                              capture_output=True, text=True, timeout=TIMEOUT)
        return done.returncode, done.stdout + done.stderr

    def records(self, **match: Any) -> list[dict[str, Any]]:
        return [r for r in scan_manifests(str(self.folder / "out")).records
                if all(r.get(k) == v for k, v in match.items())]

    def rss(self) -> list[dict[str, int]]:
        """Each rank's memory as it last wrote it (every 5 steps: waited for at first)."""
        until(lambda: all((self.folder / f"rss{rank}.json").exists() for rank in (0, 1)),
              "both ranks' rss files")
        return [json.loads((self.folder / f"rss{rank}.json").read_text()) for rank in (0, 1)]

    def stop(self) -> str:
        (self.folder / "stop").touch()
        try:
            self.output = self.proc.communicate(timeout=TIMEOUT)[0]
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.output = self.proc.communicate()[0]
        return self.output


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    running = Job(tmp_path_factory.mktemp("store") / "job")
    try:
        yield running
    finally:
        said = running.stop()
        # no attack turned the channel off, nor failed the trigger listener (either thread)
        assert "stopped answering" not in said and "trigger listener failed" not in said, \
            said[-3000:]


def _captured_once_on_both(job: Job, rid: str) -> list[int]:
    """The one step both ranks opened a capture at for request ``rid``."""
    opened = until(lambda: len(job.records(event="open", request=rid)) == 2 and
                   job.records(event="open", request=rid), f"request {rid} captured twice")
    assert sorted(r["rank"] for r in opened) == [0, 1]
    assert opened[0]["steps"] == opened[1]["steps"]
    assert {r["trigger"] for r in opened} == {"on_demand"}
    steps: list[int] = opened[0]["steps"]
    return steps


def _genuine(job: Job) -> None:
    """``trigger --steps next --wait``: accepted and captured at one step on both ranks."""
    status, said = job.trigger("--steps", "next", "--wait", "30")
    assert status == 0, said
    assert "2 listening process(es)" in said
    steps = [int(s) for s in __import__("re").findall(r"accepted: captures step (\d+)", said)]
    assert len(steps) == 2 and steps[0] == steps[1], said


def test_a_request_without_a_step_is_one_step_on_both_ranks(job: Job) -> None:
    body = json.dumps({"id": "no-step", "role": "trainer", "ranks": None, "step": None,
                       "count": 1})
    job.channel.post(body)  # straight to the store, as a tool of someone else's would
    _captured_once_on_both(job, "no-step")
    agreed = job.store.get(f"{PREFIX}step/{job.channel.cursor() - 1}")
    assert int(agreed) == _captured_once_on_both(job, "no-step")[0]


def test_a_non_integer_on_the_counter_does_not_poison_the_channel(job: Job) -> None:
    job.store.set(f"{PREFIX}requests", b"not a number")
    job.store.set(f"{PREFIX}role/trainer/listeners", b"1e9")  # a forged count, ignored
    time.sleep(1.0)  # a few polls of both listeners over it
    _genuine(job)
    assert job.channel.hint()[0] == job.channel.cursor()  # the counter is repaired


def test_oversized_values_never_pile_up_in_a_rank(job: Job) -> None:
    before = [r["peak"] for r in job.rss()]
    big = b"x" * ((8 << 20) - 4096)  # under the store's own cap
    start = job.channel.cursor()
    for i in range(100):
        index = start + i
        job.store.set(JobChannel.request_key(index), big)
        job.store.set(f"{PREFIX}requests", str(index + 1).encode())
        if i >= 8:  # the value read by both ranks is removed, as an attacker would
            old = index - 8
            until(lambda old=old: job.store.check([f"{PREFIX}answer/store-request-{old}/0",
                                                    f"{PREFIX}answer/store-request-{old}/1"]),
                  f"value {old} read by both ranks", 30)
            job.store.delete_key(JobChannel.request_key(old))
    last = start + 99
    until(lambda: job.store.check([f"{PREFIX}answer/store-request-{last}/0",
                                   f"{PREFIX}answer/store-request-{last}/1"]),
          "the last value read by both ranks", 30)
    now = time.monotonic()
    grown = until(lambda: all(r["step"] > 0 for r in job.rss()) and
                  time.monotonic() - now > 1 and job.rss(), "memory measured after")
    for rank, (was, after) in enumerate(zip(before, (r["peak"] for r in grown),
                                            strict=True)):
        assert after - was <= 100 << 20, f"rank {rank} grew {(after - was) >> 20} MiB"
    refused = job.records(event="note", note="trigger", status="refused")
    assert refused and all("larger than 4096 bytes" in r["message"] for r in refused)
    assert len(refused) <= 2 * 8  # a few per rank and minute, not one per value


def test_a_flood_of_far_off_requests_leaves_a_genuine_one_served(job: Job) -> None:
    start = job.channel.cursor()
    index = start
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # far off, each sooner than the last
        for _ in range(200):
            body = json.dumps({"id": f"flood-{index}", "role": "trainer", "ranks": None,
                               "step": 10**12 - index, "count": 1})
            job.store.set(JobChannel.request_key(index), body.encode())
            index += 1
        job.store.set(f"{PREFIX}requests", str(index).encode())
    assert index - start > 10_000
    _genuine(job)
    for manifest in (job.folder / "out" / "manifests").iterdir():
        assert manifest.stat().st_size < 2 << 20, manifest
    notes = job.records(event="note", note="trigger")
    assert len(notes) < 2 * (64 + 8 + 8 + 8 + 8)  # per rank: a burst per kind, no more


# -- the command against servers that are no store --------------------------------------

class Server:
    """A TCP server on 127.0.0.1 that accepts and then ``mode``s: resets, sends garbage,
    or says nothing. Its thread ends with the test."""

    def __init__(self, mode: str) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.mode = mode
        self.held: list[socket.socket] = []
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            if self.mode == "reset":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
                continue
            if self.mode == "garbage":
                conn.sendall(b"\xff\x00HTTP/1.1 400 Bad Request\r\n\r\n" * 4)
            self.held.append(conn)

    def close(self) -> None:
        self.done.set()
        for conn in self.held:
            conn.close()
        self.sock.close()


def _closed_port() -> int:
    return _port()  # bound a moment ago, closed: nothing listens there


@pytest.mark.parametrize("mode", ["closed", "unresolvable", "reset", "garbage", "silent"])
def test_trigger_store_gives_up_in_one_clear_line(tmp_path: Path, mode: str) -> None:
    server = None
    if mode == "closed":
        where = f"127.0.0.1:{_closed_port()}"
    elif mode == "unresolvable":
        where = "no-such-host.invalid:29500"
    else:
        server = Server(mode)
        where = f"127.0.0.1:{server.port}"
    try:  # a command that never gives up runs into the timeout
        done = subprocess.run([sys.executable, "-m", "policy_engine", "trigger", str(tmp_path),
                               "--role", "trainer", "--store", where], env=child_env(),
                              capture_output=True, text=True, timeout=60)
    finally:
        if server is not None:
            server.close()
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"policy-engine trigger: error: cannot reach the job's store "
                               f"at {where}: ")
    why = lines[0].split(": ", 3)[-1]
    # reset and garbage: torch's client gives up on them, or tries again until our deadline
    expected = {"closed": ("Connection refused",),
                "unresolvable": ("cannot resolve no-such-host.invalid",),
                "reset": ("Connection reset by peer", "no answer within 12 s"),
                "garbage": ("Ping failed, invalid value returned from server",
                            "no answer within 12 s"),
                "silent": ("no answer within 12 s",)}[mode]
    assert why.startswith(expected), why


# -- the command when the job's store goes away under it ---------------------------------

_STORE = """
import datetime, json, sys, time
import torch.distributed as dist
from policy_engine.runtime.triggers.channel import JobChannel, StoreKV
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=30))
job = JobChannel(StoreKV(store), "trainer")  # one listener that never answers
job.publish(job.register(json.dumps({"pid": 1}).encode()),
            {"step": 5, "time": time.time(), "rate": 1.0})
print("ready", flush=True)
time.sleep(120)
"""


def test_trigger_says_in_one_line_that_the_store_went_away(tmp_path: Path) -> None:
    """The store dies while ``--wait`` reads answers: one line naming the store and why,
    and none of torch's C++ log lines or stack frames, even where the shell asks for them
    (a job's debugging settings)."""
    port = _port()
    store = subprocess.Popen([sys.executable, "-c", _STORE, str(port)], env=child_env(),
                             stdout=subprocess.PIPE, text=True)
    try:
        assert store.stdout is not None and store.stdout.readline().strip() == "ready"
        env = {**child_env(), "TORCH_SHOW_CPP_STACKTRACES": "1", "TORCH_CPP_LOG_LEVEL": "INFO"}
        trigger = subprocess.Popen(
            [sys.executable, "-m", "policy_engine", "trigger", str(tmp_path), "--role",
             "trainer", "--store", f"127.0.0.1:{port}", "--wait", "30"], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert trigger.stdout is not None
        first = trigger.stdout.readline()
        assert first.startswith(f"through the job's store at 127.0.0.1:{port}"), first
        store.kill()
        trigger.wait(timeout=TIMEOUT)  # a few lines: no pipe fills meanwhile
        assert trigger.stderr is not None
        out, err = trigger.stdout.read(), trigger.stderr.read()
    finally:
        store.kill()
        store.wait()
    assert trigger.returncode == 1
    assert out.startswith("request "), (first, out, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"policy-engine trigger: error: the job's store at "
                               f"127.0.0.1:{port} stopped answering after 0 of 1 answer(s): "), err


# -- a store that hangs: stopped, its connections left open ------------------------------

_SERVER = """
import datetime, sys, time
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=30))
print(store.port, flush=True)
time.sleep(600)
"""
_LOOP = """
import os, time
import torch.distributed as dist
from policy_engine import apply_policy, load_policy
class Worker:
    pass
dist.init_process_group("gloo")  # env://, a client of the agent's store, as under torchrun
prof = apply_policy(Worker(), "trainer", load_policy("policy.yaml"))
step = 0
while not os.path.exists("stop"):
    step += 1
    with prof.training_step(step):
        time.sleep(0.05)
    with open(".steps", "w") as f:
        f.write(str(step))
    os.replace(".steps", "steps")
prof.close()
print("trained", step, "steps", flush=True)
"""


def test_a_store_that_hangs_hands_the_requests_to_the_folder(tmp_path: Path) -> None:
    """The job's store stops answering without closing its connections (its process
    stopped by SIGSTOP) while a training loop listens there: the loop goes on, its
    listener gives the store up with one warning, and a request `policy-engine trigger`
    writes under triggers/ (the store does not answer it either) is captured."""
    import os
    import signal

    (tmp_path / "policy.yaml").write_text(POLICY)
    server = subprocess.Popen([sys.executable, "-c", _SERVER], env=child_env(),
                              stdout=subprocess.PIPE, text=True)
    log = (tmp_path / "loop.log").open("w")
    loop = None
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        env = {**child_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
               "TORCHELASTIC_USE_AGENT_STORE": "True"}
        loop = subprocess.Popen([sys.executable, "-c", _LOOP], cwd=tmp_path, env=env,
                                stdout=log, stderr=subprocess.STDOUT)
        client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                               timeout=datetime.timedelta(seconds=10))
        channel = JobChannel(StoreKV(client), "trainer")
        steps = tmp_path / "steps"
        # (its report comes during its first step; the steps file once that step ends)
        until(lambda: loop.poll() is None and steps.exists() and
              [r for r in channel.reports() if isinstance(r, dict) and "step" in r],
              "the loop listening on the store")
        os.kill(server.pid, signal.SIGSTOP)
        stopped_at = int(steps.read_text())
        done = subprocess.run([sys.executable, "-m", "policy_engine", "trigger", "out",
                               "--role", "trainer", "--wait", "60"], cwd=tmp_path,
                              env=child_env(), capture_output=True, text=True,
                              timeout=TIMEOUT)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"the job's store at 127.0.0.1:{port} (from out/triggers/channel) does not " \
               "answer" in done.stderr, done.stderr
        assert "reads it only once its own calls to that store have failed" in done.stderr
        assert "accepted: captures step" in done.stdout, done.stdout
        [opened] = [r for r in scan_manifests(str(tmp_path / "out")).records
                    if r["event"] == "open"]
        assert opened["trigger"] == "on_demand"
        assert int(steps.read_text()) > stopped_at + 20  # the loop never waited for it
        (tmp_path / "stop").touch()
        assert loop.wait(TIMEOUT) == 0  # and it ends while the store is still stopped
    finally:
        if loop is not None and loop.poll() is None:
            loop.kill()
            loop.wait()
        log.close()
        os.kill(server.pid, signal.SIGCONT)
        server.kill()
        server.wait()
    said = (tmp_path / "loop.log").read_text()
    gone = [line for line in said.splitlines() if "stopped answering" in line]
    assert len(gone) == 1, said
    assert f"the job's store at 127.0.0.1:{port} stopped answering (TimeoutError: no " \
           "answer within 10 s)" in gone[0], said
    assert "trained" in said
