"""The thread model: any role, any thread, never a crash, nothing lost.

The in-process stress test drives captures from many threads at once through the
recording backend, which (like torch.profiler) refuses any call that does not come from
the thread that opened the capture: a violation there is what would crash a real run.
The slow test runs the same shapes on real torch in subprocesses.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from policy_engine import Topology, apply_policy, profile_session
from policy_engine.runtime.process import state
from policy_engine.testing import recording_backend

ROUNDS = int(os.environ.get("POLICY_ENGINE_STRESS_ROUNDS", "60"))
SCRIPT = Path(__file__).parent / "thread_scripts" / "stress_torch.py"


def manifest_lines(out: Path) -> list[dict[str, Any]]:
    lines = []
    for path in sorted((out / "manifests").glob("*.jsonl")):
        lines += [json.loads(line) for line in path.read_text().splitlines()]
    return lines


def check_manifest(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Every capture opened was closed once; every trace belongs to an opened capture and
    its file is on disk; a summary line (written when its worker is done, so possibly
    after the close) names a trace of its capture, once. Returns the lines by capture id,
    summaries left out."""
    by_capture: dict[str, list[dict[str, Any]]] = {}
    summaries: dict[str, list[dict[str, Any]]] = {}
    for line in manifest_lines(out):
        into = summaries if line["event"] == "summary" else by_capture
        into.setdefault(line["capture"], []).append(line)
    for cid, found in summaries.items():
        paths = [line["path"] for line in by_capture.get(cid, []) if line["event"] == "trace"]
        named = [line["path"] for line in found]
        assert len(named) == len(set(named)) and set(named) <= set(paths), (cid, found)
    for cid, lines in by_capture.items():
        events = [line["event"] for line in lines]
        assert events[0] == "open", (cid, events)
        assert events.count("close") == 1 and events[-1] == "close", (cid, events)
        assert set(events[1:-1]) <= {"trace"}, (cid, events)
        close = lines[-1]
        assert close["traces"] == events.count("trace"), (cid, lines)
        for trace in lines[1:-1]:
            if trace["path"] is not None:
                assert (out / trace["path"]).is_file(), trace
    return by_capture


class Worker:
    def __init__(self, role: str, policy: dict[str, Any], topology: Topology) -> None:
        self.prof = apply_policy(self, role, policy, topology)

    def update(self, inner: int, fail: bool = False) -> int:
        for _ in range(inner):
            self.prof.step()
        if fail:
            raise KeyError("boom")
        return inner


def stress_policy(out: Path, rng: random.Random) -> dict[str, Any]:
    schedule = {"skip_first": rng.choice([0, 1]), "wait": rng.choice([0, 1, 2]),
                "warmup": rng.choice([0, 1]), "active": rng.choice([1, 2, 3]),
                "repeat": rng.choice([1, 2, 0])}
    role = {"enabled": True, "steps": "1-6", "merge_steps": rng.random() < 0.3,
            "schedule": schedule, "regions": ["update"],
            "name": "<role>[_step<step>][_c<cycle>]_r<rank>_<timestamp>"}
    return {"version": 1, "output_dir": str(out), "colocate": [["actor", "ref"]],
            "roles": {"actor": dict(role), "ref": dict(role)}}


def run_threads(*targets: Callable[[], None]) -> list[BaseException]:
    errors: list[BaseException] = []

    def guard(fn: Callable[[], None]) -> None:
        try:
            fn()
        except KeyError:  # the user's own exception, raised on purpose
            pass
        except BaseException as err:  # anything else escaped the engine
            errors.append(err)

    threads = [threading.Thread(target=guard, args=(t,)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive(), "a thread hung"
    return errors


def one_round(out: Path, seed: int) -> None:
    rng = random.Random(seed)
    policy = stress_policy(out, rng)
    topo = Topology()
    with recording_backend("torch") as rec:
        actor, ref = Worker("actor", policy, topo), Worker("ref", policy, topo)
        fail_at = rng.randint(1, 8)

        def trainer(worker: Worker, seed: int) -> Callable[[], None]:
            local = random.Random(seed)

            def run() -> None:
                for n in range(1, 8):
                    fail = n == fail_at and local.random() < 0.5
                    with worker.prof.training_step(n):
                        worker.update(local.randint(0, 6), fail=fail)
            return run

        def stepper() -> None:
            for _ in range(rng.randint(0, 20)):
                actor.prof.step()

        errors = run_threads(trainer(actor, seed), trainer(ref, seed + 1),
                             *[stepper for _ in range(rng.randint(0, 6))])
        actor.prof.close()
        ref.prof.close()
    assert errors == []
    assert rec.violations == []
    check_manifest(out)


@pytest.mark.parametrize("seed", range(ROUNDS))
def test_stress_many_threads(tmp_path: Path, seed: int) -> None:
    one_round(tmp_path / "out", seed)


def test_step_from_another_thread_waits_for_the_home_thread(tmp_path: Path) -> None:
    policy = {"version": 1, "output_dir": str(tmp_path),
              "roles": {"actor": {"enabled": True, "steps": [1],
                                  "schedule": {"wait": 1, "active": 2, "repeat": 1}}}}
    with recording_backend("torch") as rec:
        prof = profile_session(policy, "actor", Topology())
        with prof.training_step(1):
            thread = threading.Thread(target=prof.step)
            thread.start()
            thread.join()
            assert [c[0] for c in rec.calls] == ["open"]  # waits for this thread
            prof.step()  # the home thread applies it now
            assert [c[0] for c in rec.calls] == ["open", "start", "step"]
    assert rec.violations == []
    lines = check_manifest(tmp_path)
    [capture] = lines.values()
    assert capture[-1]["thread_waits"] == 1 and "deferred" not in capture[-1]


def test_capture_ended_on_another_thread_ends_on_its_own(tmp_path: Path) -> None:
    policy = {"version": 1, "output_dir": str(tmp_path),
              "roles": {"actor": {"enabled": True, "steps": [1, 2], "merge_steps": True}}}
    with recording_backend("torch") as rec:
        prof = profile_session(policy, "actor", Topology())
        with prof.training_step(1):
            prof.step()
        worker = threading.Thread(target=lambda: prof.training_step(2).__exit__(None))
        worker.start()
        worker.join()
        assert "save" not in [c[0] for c in rec.calls]  # not from the worker thread
        prof.step()  # the home thread's next call ends it
        assert [c[0] for c in rec.actions()][-2:] == ["save", "close"]
    assert rec.violations == []
    check_manifest(tmp_path)


def test_any_thread_backend_is_driven_where_the_step_lands(tmp_path: Path) -> None:
    policy = {"version": 1, "output_dir": str(tmp_path),
              "roles": {"actor": {"enabled": True, "steps": [1],
                                  "schedule": {"wait": 1, "active": 1, "repeat": 1}}}}
    with recording_backend("torch", any_thread=True) as rec:
        prof = profile_session(policy, "actor", Topology())
        with prof.training_step(1):
            thread = threading.Thread(target=prof.step)
            thread.start()
            thread.join()
            assert [c[0] for c in rec.calls] == ["open", "start", "step"]
    check_manifest(tmp_path)


@pytest.mark.slow
def test_stress_real_torch_in_subprocesses(tmp_path: Path) -> None:
    """The same shapes on torch.profiler: every process exits cleanly, traces are whole."""
    pytest.importorskip("torch")
    procs = []
    for seed in range(4):
        out = tmp_path / f"run{seed}"
        procs.append((out, subprocess.Popen(
            [sys.executable, str(SCRIPT), str(out), str(seed)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    for out, proc in procs:
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, output[-3000:]
        by_capture = check_manifest(out)
        assert by_capture
        traces = [line for lines in by_capture.values() for line in lines
                  if line["event"] == "trace" and line["path"]]
        assert traces
        import gzip

        for trace in traces:
            data = json.loads(gzip.decompress((out / trace["path"]).read_bytes()))
            assert data["traceEvents"]


def test_reset_forgets_everything(tmp_path: Path) -> None:
    policy = {"version": 1, "output_dir": str(tmp_path),
              "roles": {"actor": {"enabled": True, "steps": [1]}}}
    with recording_backend("torch"):
        prof = profile_session(policy, "actor", Topology())
        with prof.training_step(1):
            state.reset()
            assert state.captures() == []
    check_manifest(tmp_path)
