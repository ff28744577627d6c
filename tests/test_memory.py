"""The memory backend: allocator history per capture, OOM dumps, and backend lists.

torch.cuda.memory needs a CUDA device, so these tests drive the backend through a stand-in
for it that records every call and writes a snapshot the way torch does (a pickle of a dict
with ``segments``, ``device_traces``, ``allocator_settings``, ``external_annotations``);
its signatures are checked against the installed torch's own functions.
"""

from __future__ import annotations

import inspect
import json
import logging
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from policy_engine import PolicyError, ProfilingError, Topology, load_policy, profile_session
from policy_engine.analysis.listing import collect
from policy_engine.analysis.manifests import read_manifests, scan_manifests
from policy_engine.backends.memory.device import CudaMemory
from policy_engine.backends.memory.session import MemoryBackend
from policy_engine.cli.main import main
from policy_engine.runtime.process import state
from policy_engine.testing import recording_backend


class FakeCudaMemory:
    """Stands in for ``torch.cuda.memory`` (and the OOM attach call) and records calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.observers: list[Any] = []
        self.enabled = False
        self.events: list[dict[str, Any]] = []

    def _record_memory_history(self, enabled: str | None = "all", context: str | None = "all",
                               stacks: str = "all", max_entries: int = 1 << 62) -> None:
        self.calls.append(("record", {"enabled": enabled, "context": context,
                                      "stacks": stacks, "max_entries": max_entries}))
        self.enabled = enabled is not None
        if not self.enabled:
            self.events = []

    def _dump_snapshot(self, filename: str = "dump_snapshot.pickle") -> None:
        self.calls.append(("dump", filename))
        snapshot = {
            "segments": [{"device": 0, "address": 4096, "total_size": 2 << 20,
                          "allocated_size": 1 << 20, "active_size": 1 << 20, "stream": 0,
                          "segment_type": "large",
                          "blocks": [{"size": 1 << 20, "requested_size": 1 << 20,
                                      "address": 4096, "state": "active_allocated",
                                      "frames": [{"filename": "train.py", "line": 3,
                                                  "name": "forward"}]}]}],
            "device_traces": [list(self.events)],
            "allocator_settings": {},
            "external_annotations": [],
        }
        with open(filename, "wb") as f:
            pickle.dump(snapshot, f)

    def allocate(self, size: int) -> None:
        """A training step's allocation, seen only while history is on."""
        if self.enabled:
            self.events.append({"action": "alloc", "addr": 4096 + len(self.events) * 512,
                                "size": size, "stream": 0, "time_us": len(self.events) + 1,
                                "frames": [{"filename": "train.py", "line": 9,
                                            "name": "step"}]})

    def attach(self, observer: Any) -> None:
        self.calls.append(("attach", None))
        self.observers.append(observer)

    def out_of_memory(self, asked: int) -> None:
        """What the allocator does when it fails: call every observer with four ints."""
        for observer in self.observers:
            observer(0, asked, 70 << 30, 1 << 20)


def test_the_stand_in_takes_what_torch_takes() -> None:
    import torch.cuda.memory as real

    fake = FakeCudaMemory()
    for name in ("_record_memory_history", "_dump_snapshot"):
        ours = inspect.signature(getattr(fake, name)).parameters
        theirs = inspect.signature(getattr(real, name)).parameters
        assert set(ours) <= set(theirs), name
        for key in ours:
            assert ours[key].default == theirs[key].default or key == "max_entries", key


@pytest.fixture
def cuda() -> Iterator[FakeCudaMemory]:
    fake = FakeCudaMemory()
    state.slot("memory").backend = MemoryBackend(CudaMemory(memory=fake, attach=fake.attach))
    yield fake


def policy(out: Path, **role: Any) -> dict[str, Any]:
    body = {"enabled": True, "backend": "memory", "steps": [2, 3],
            "name": "<role>_step<step>_rank<rank>", "torch": {"activities": ["cpu"]}}
    body.update(role)
    return {"version": 1, "output_dir": str(out), "roles": {"actor": body}}


def run(data: dict[str, Any], fake: FakeCudaMemory | None, steps: int = 6,
        inner: int = 2) -> list[tuple[str, Any]]:
    """A training loop; returns the stand-in's calls with the loop's steps between them."""
    seen: list[tuple[str, Any]] = []
    prof = profile_session(data, "actor", Topology())
    for n in range(steps):
        with prof.training_step(n):
            for i in range(inner):
                if fake is not None:
                    fake.allocate(1024 * (i + 1))
                    seen.extend(fake.calls)
                    fake.calls.clear()
                seen.append(("step", (n, i)))
                prof.step()
    prof.close()
    if fake is not None:
        seen.extend(fake.calls)
    return seen


def traces(out: Path) -> list[dict[str, Any]]:
    return sorted(read_manifests(str(out)), key=lambda r: (r["path"] or "", r["status"]))


def test_history_on_while_recording_and_one_snapshot_per_step(tmp_path: Path,
                                                               cuda: FakeCudaMemory) -> None:
    out = tmp_path / "out"
    calls = run(policy(out, memory={"max_entries": 5000, "context": "alloc"}), cuda)
    kinds = [c[0] if c[0] != "step" else f"step{c[1][0]}" for c in calls]
    # the observer attached once, when the first capture opens; history on before step 2's
    # first recorded step, dumped and off at its end
    first = kinds.index("record")
    assert kinds.count("attach") == 1 and kinds[first - 1] == "attach"
    assert kinds[first + 1] == "step2"
    assert calls[first][1] == {"enabled": "all", "context": "alloc", "stacks": "python",
                               "max_entries": 5000}
    assert "step0" in kinds[:first] and "step1" in kinds[:first]
    dumps = [i for i, k in enumerate(kinds) if k == "dump"]
    assert len(dumps) == 2
    for i in dumps:
        assert calls[i + 1] == ("record", {"enabled": None, "context": "all", "stacks": "all",
                                           "max_entries": 1 << 62})
    rows = traces(out)
    assert [r["path"] for r in rows] == ["actor_step2_rank0.pickle", "actor_step3_rank0.pickle"]
    assert {r["status"] for r in rows} == {"complete"}
    assert {r["backend"] for r in rows} == {"memory"}
    with open(out / "actor_step2_rank0.pickle", "rb") as f:
        snapshot = pickle.load(f)
    assert set(snapshot) == {"segments", "device_traces", "allocator_settings",
                             "external_annotations"}
    assert [e["size"] for e in snapshot["device_traces"][0]] == [1024, 2048]


def test_schedule_turns_history_on_for_active_steps_only(tmp_path: Path,
                                                         cuda: FakeCudaMemory) -> None:
    out = tmp_path / "out"
    data = policy(out, steps=[1], merge_steps=True,
                  schedule={"wait": 1, "warmup": 1, "active": 2, "repeat": 1})
    calls = run(data, cuda, steps=2, inner=5)
    on = [i for i, c in enumerate(calls) if c[0] == "record" and c[1]["enabled"] == "all"]
    assert len(on) == 1
    # inner steps 0 (wait), 1 (warm-up), then recording from inner step 2
    assert [c for c in calls[:on[0]] if c[0] == "step" and c[1][0] == 1] == [
        ("step", (1, 0)), ("step", (1, 1))]
    assert [r["inner_steps"] for r in traces(out)] == [[2, 3]]


def test_torch_and_memory_record_the_same_captures(tmp_path: Path,
                                                   cuda: FakeCudaMemory) -> None:
    out = tmp_path / "out"
    run(policy(out, backend=["torch", "memory"]), cuda, steps=4)
    rows = traces(out)
    assert [(r["path"], r["backend"]) for r in rows] == [
        ("actor_step2_rank0.pickle", "memory"), ("actor_step2_rank0.pt.trace.json.gz", "torch"),
        ("actor_step3_rank0.pickle", "memory"), ("actor_step3_rank0.pt.trace.json.gz", "torch")]
    assert {r["status"] for r in rows} == {"complete"}
    assert {r["capture"] for r in rows[:2]} != {r["capture"] for r in rows[2:]}
    assert len({r["capture"] for r in rows[:2]}) == 1  # one capture, two files
    closes = [r for r in scan_manifests(str(out)).records if r["event"] == "close"]
    assert [c["traces"] for c in closes] == [2, 2]
    assert {r["backend"] for r in scan_manifests(str(out)).records
            if r["event"] == "open"} == {"torch+memory"}


def test_out_of_memory_dumps_the_history(tmp_path: Path, cuda: FakeCudaMemory,
                                         caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "out"
    prof = profile_session(policy(out), "actor", Topology())
    with prof.training_step(2):
        cuda.allocate(4096)
        prof.step()
        with caplog.at_level(logging.WARNING):
            cuda.out_of_memory(8 << 30)
    with prof.training_step(3):
        pass
    cuda.out_of_memory(1 << 30)  # no capture open: nothing to write
    prof.close()
    rows = traces(out)
    oom = [r for r in rows if r["status"] == "oom"]
    assert [r["path"] for r in oom] == ["actor_step2_rank0_oom.pickle"]
    assert oom[0]["extra"] == {"device": "cuda", "device_index": 0, "bytes_asked": 8 << 30,
                               "device_limit": 70 << 30, "device_free": 1 << 20,
                               "history": True}
    assert oom[0]["capture"] == next(r for r in rows if r["path"] ==
                                     "actor_step2_rank0.pickle")["capture"]
    assert "out of memory on cuda:0" in caplog.text
    with open(out / "actor_step2_rank0_oom.pickle", "rb") as f:
        assert pickle.load(f)["device_traces"][0][0]["size"] == 4096
    # traces lists the dump with its status
    assert main(["traces", str(out), "--format", "json"]) == 0


def test_oom_dump_off_when_asked(tmp_path: Path, cuda: FakeCudaMemory) -> None:
    out = tmp_path / "out"
    prof = profile_session(policy(out, memory={"on_oom": False}), "actor", Topology())
    with prof.training_step(2):
        cuda.out_of_memory(1)
    prof.close()
    assert cuda.observers == [] and [r["status"] for r in traces(out)] == ["complete"]


def test_plot_beside_each_snapshot(tmp_path: Path, cuda: FakeCudaMemory) -> None:
    out = tmp_path / "out"
    run(policy(out, steps=[2], memory={"plot": True}), cuda, steps=3)
    (row,) = traces(out)
    assert row["extra"]["plot"] == "actor_step2_rank0.html"
    page = (out / "actor_step2_rank0.html").read_text()
    listed = collect(str(out))
    assert listed["unlisted"] == [] and len(listed["traces"]) == 1
    assert "<svg" in page and "http://" not in page and "https://" not in page


# -- without a GPU ----------------------------------------------------------------------

def test_no_cuda_warns_once_and_training_goes_on(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING):
        run(policy(out), None)
    failed = [r.getMessage() for r in caplog.records if "memory" in r.getMessage()]
    assert len(failed) == 1
    assert "role 'actor' on rank 0" in failed[0] and "CUDA" in failed[0]
    assert [r["status"] for r in traces(out)] == ["failed"]


def test_no_cuda_leaves_memory_out_of_a_torch_capture(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING), recording_backend("torch"):
        run(policy(out, backend=["torch", "memory"]), None)
    left = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(left) == 1
    assert "memory is left out of the captures of role 'actor' on rank 0" in left[0]
    assert [(r["path"], r["status"]) for r in traces(out)] == [
        ("actor_step2_rank0.rec", "complete"), ("actor_step3_rank0.rec", "complete")]
    # the manifest says so too, once
    notes = [r for r in scan_manifests(str(out)).records if r["event"] == "note"]
    assert [(n["note"], n["backend"], n["role"], n["rank"]) for n in notes] == [
        ("left_out", "memory", "actor", 0)]
    assert "allocator history cannot be recorded" in notes[0]["message"]
    assert "CUDA" in notes[0]["message"]


def test_no_cuda_raises_under_on_error_raise(tmp_path: Path) -> None:
    prof = profile_session(policy(tmp_path / "out", on_error="raise",
                                  backend=["torch", "memory"]), "actor", Topology())
    with pytest.raises(ProfilingError, match=r"torch\+memory profiling .* CUDA"), \
            prof.training_step(2):
        pass


def test_a_failed_snapshot_fails_the_capture_and_keeps_the_trace(
        tmp_path: Path, cuda: FakeCudaMemory, caplog: pytest.LogCaptureFixture) -> None:
    def broken(filename: str = "dump_snapshot.pickle") -> None:
        raise OSError(28, "No space left on device")
    cuda._dump_snapshot = broken  # type: ignore[method-assign]
    out = tmp_path / "out"
    with recording_backend("torch"), caplog.at_level(logging.WARNING):
        # sync: the failure turns the role off before step 3 (in the background it is
        # seen at the first step boundary after the export ran)
        run(policy(out, backend=["torch", "memory"], export={"mode": "sync"}), cuda)
    rows = traces(out)
    assert [(r["path"], r["status"], r.get("backend")) for r in rows] == [
        (None, "failed", "memory"), ("actor_step2_rank0.rec", "complete", "torch")]
    assert "No space left" in rows[0]["error"]
    assert "profiling is off" in caplog.text
    assert cuda.enabled is False  # history was turned off all the same


# -- the language -------------------------------------------------------------------------

def problems(data: dict[str, Any]) -> list[str]:
    try:
        load_policy(data)
    except PolicyError as err:
        return [p.render() for p in err.problems]
    return []


@pytest.mark.parametrize(("backend", "expected"), [
    (["torch", "memory"], None),
    (["torch_memory"], None),
    (["nsight", "memory"], None),
    (["mstx", "memory"], None),
    (["memory", "torch"], None),
    (["torch", "mstx"], "torch and mstx cannot record the same capture: torch.profiler and "
                        "torch_npu's profiler drive the same framework profiler"),
    (["nsight", "torch", "memory"], "nsight and torch cannot record the same capture"),
    (["memory", "torch_memory"], "torch_memory names backend memory a second time"),
    ([], "backend must not be empty"),
])
def test_backend_lists(tmp_path: Path, backend: list[str], expected: str | None) -> None:
    found = problems(policy(tmp_path, backend=backend))
    if expected is None:
        assert found == []
    else:
        assert any(expected in p for p in found), found


def test_backend_list_order_puts_the_timeline_first(tmp_path: Path) -> None:
    spec = load_policy(policy(tmp_path, backend=["memory", "nsys"])).role("actor")
    assert spec.backends == ("nsight", "memory") and spec.backend == "nsight"
    assert spec.backend_label == "nsight+memory"


def test_memory_settings_are_checked(tmp_path: Path) -> None:
    found = problems(policy(tmp_path, memory={"stacks": "cpp", "max_entries": 0}))
    assert any("stacks" in p for p in found) and any("max_entries" in p for p in found)


def test_memory_snapshots_beside_nsight_need_step_in_the_name(tmp_path: Path) -> None:
    found = problems(policy(tmp_path, backend=["nsight", "memory"], name="<role>_rank<rank>"))
    assert any("add <step>" in p for p in found)
    assert problems(policy(tmp_path, backend="nsight", name="<role>_rank<rank>")) == []


def test_memory_timeline_needs_its_flags(tmp_path: Path) -> None:
    found = problems(policy(tmp_path, backend="torch",
                            torch={"memory_timeline": True, "profile_memory": True}))
    assert any("memory_timeline needs record_shapes, with_stack: true as well" in p
               for p in found)


def test_colocated_roles_agree_on_backends(tmp_path: Path) -> None:
    data = policy(tmp_path, backend=["torch", "memory"])
    data["roles"]["ref"] = dict(data["roles"]["actor"], backend="torch")
    data["colocate"] = [["actor", "ref"]]
    found = problems(data)
    assert any("differ in list of backends ('torch+memory' and 'torch')" in p for p in found), found
    data["roles"]["ref"]["backend"] = "memory"
    data["roles"]["actor"]["backend"] = ["torch", "memory"]
    found = problems(data)
    assert any("would both record allocator history" in p for p in found), found


def test_validate_check_runtime_says_cuda(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(policy(tmp_path / "out")))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert main(["validate", "--check-runtime", str(path)]) == 1
    assert "backend memory: allocator history needs a CUDA device" in capsys.readouterr().out


def test_explain_names_both_backends(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(policy(tmp_path / "out", backend=["torch", "memory"])))
    assert main(["explain", str(path), "--role", "actor", "--world", "2"]) == 0
    assert "profiled with torch + memory, steps 2,3" in capsys.readouterr().out


def test_torch_memory_timeline_beside_the_trace(tmp_path: Path) -> None:
    import gzip

    import torch

    out = tmp_path / "out"
    data = policy(out, backend="torch", steps=[1],
                  torch={"activities": ["cpu"], "memory_timeline": True, "profile_memory": True,
                         "record_shapes": True, "with_stack": True})
    prof = profile_session(data, "actor", Topology())
    for n in range(3):
        with prof.training_step(n):
            x = torch.ones(256, 256, requires_grad=True)
            (x @ x).sum().backward()
            prof.step()
    prof.close()
    (row,) = traces(out)
    timeline = row["extra"]["memory_timeline"]
    assert timeline == "actor_step1_rank0.memory.json.gz"
    with gzip.open(out / timeline, "rt") as f:
        times, sizes = json.load(f)
    assert len(times) == len(sizes) > 0


def test_regions_are_ranges_in_a_combined_capture(tmp_path: Path,
                                                  cuda: FakeCudaMemory) -> None:
    from policy_engine import apply_policy

    class Worker:
        def update_actor(self) -> int:
            cuda.allocate(512)
            return 7

    worker = Worker()
    with recording_backend("torch") as rec:
        prof = apply_policy(worker, "actor", policy(tmp_path / "out", backend=["torch", "memory"],
                                                    regions=["update_actor"]), Topology())
        with prof.training_step(2):
            assert worker.update_actor() == 7
        prof.close()
    assert ("range_start", "update_actor") in rec.calls
    assert ("range_end", "update_actor") in rec.calls
    rows = traces(tmp_path / "out")
    assert [r["backend"] for r in rows] == ["memory", "torch"]


def test_one_out_of_memory_snapshot_per_capture(tmp_path: Path, cuda: FakeCudaMemory,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "out"
    prof = profile_session(policy(out), "actor", Topology())
    with caplog.at_level(logging.WARNING), prof.training_step(2):
        cuda.out_of_memory(8 << 30)
        cuda.out_of_memory(4 << 30)  # a retry that failed again
    prof.close()
    assert [r["path"] for r in traces(out) if r["status"] == "oom"] == [
        "actor_step2_rank0_oom.pickle"]
    assert "has its out-of-memory snapshot already" in caplog.text


def test_an_observer_that_cannot_attach_is_reported(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeCudaMemory()

    def refuse(observer: Any) -> None:
        raise RuntimeError("cudaMallocAsync does not support an out-of-memory observer")
    state.slot("memory").backend = MemoryBackend(CudaMemory(memory=fake, attach=refuse))
    with caplog.at_level(logging.WARNING):
        prof = profile_session(policy(tmp_path / "out"), "actor", Topology())
        with prof.training_step(2):
            pass
        prof.close()
    assert "no out-of-memory callback on cuda (RuntimeError: cudaMallocAsync" in caplog.text
    assert [r["status"] for r in traces(tmp_path / "out")] == ["complete"]


# -- history: always ---------------------------------------------------------------------

def records(out: Path, event: str) -> list[dict[str, Any]]:
    return [r for r in scan_manifests(str(out)).records if r["event"] == event]


def test_history_always_is_on_from_the_start_and_dumps_an_oom_between_planned_steps(
        tmp_path: Path, cuda: FakeCudaMemory, caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "out"
    prof = profile_session(policy(out, memory={"history": "always", "max_entries": 500}),
                           "actor", Topology())
    # on before the first step, with the role's settings, the observer attached
    assert cuda.calls == [("record", {"enabled": "all", "context": "all", "stacks": "python",
                                      "max_entries": 500}), ("attach", None)]
    for n in range(5):
        with prof.training_step(n):
            cuda.allocate(1000 + n)
            if n == 1:  # no capture is open in step 1 (steps: [2, 3])
                with caplog.at_level(logging.WARNING):
                    cuda.out_of_memory(8 << 30)
                    cuda.out_of_memory(4 << 30)  # a retry in the same step: no second file
            prof.step()
    # a planned capture dumps the history and leaves it on
    assert cuda.enabled and [c[0] for c in cuda.calls].count("record") == 1
    prof.close()
    assert cuda.calls[-1] == ("record", {"enabled": None, "context": "all", "stacks": "all",
                                         "max_entries": 1 << 62})
    assert not cuda.enabled
    rows = traces(out)
    assert [(r["path"], r["status"]) for r in rows] == [
        ("actor_step1_rank0_oom.pickle", "oom"), ("actor_step2_rank0.pickle", "complete"),
        ("actor_step3_rank0.pickle", "complete")]
    oom = rows[0]
    assert oom["steps"] == [1] and oom["trigger"] == "oom" and oom["backend"] == "memory"
    assert oom["extra"] == {"device": "cuda", "device_index": 0, "bytes_asked": 8 << 30,
                            "device_limit": 70 << 30, "device_free": 1 << 20, "history": True}
    assert oom["role"] == "actor" and oom["rank"] == 0 and oom["bytes"] > 0
    with open(out / "actor_step1_rank0_oom.pickle", "rb") as f:  # the history from step 0
        assert [e["size"] for e in pickle.load(f)["device_traces"][0]] == [1000, 1001]
    with open(out / "actor_step3_rank0.pickle", "rb") as f:  # bounded by max_entries only
        assert [e["size"] for e in pickle.load(f)["device_traces"][0]] == [
            1000, 1001, 1002, 1003]
    assert "outside a capture: allocator history written to" in caplog.text
    assert "one is written per step" in caplog.text
    # traces lists the dump as a file of the run, and nothing as interrupted or unlisted
    listed = collect(str(out))
    assert listed["unlisted"] == [] and listed["interrupted"] == []
    assert listed["bad_lines"] == [] and listed["missing"] == [] and len(listed["traces"]) == 3
    assert main(["report", str(out), "-o", str(tmp_path / "report.html")]) == 0
    assert "actor_step1_rank0_oom.pickle" in (tmp_path / "report.html").read_text()


def test_history_always_oom_outside_any_step_and_after_close(
        tmp_path: Path, cuda: FakeCudaMemory) -> None:
    out = tmp_path / "out"
    data = policy(out, memory={"history": "always"}, name="<role>[_step<step>]_rank<rank>")
    prof = profile_session(data, "actor", Topology())
    with prof.training_step(0):
        pass
    cuda.out_of_memory(1 << 30)  # between steps: the name has no step
    prof.close()
    cuda.out_of_memory(1 << 30)  # the role closed: nothing
    assert [(r["path"], r["steps"]) for r in traces(out)] == [("actor_rank0_oom.pickle", [])]


def test_history_always_inside_a_capture_dumps_as_before(tmp_path: Path,
                                                          cuda: FakeCudaMemory) -> None:
    out = tmp_path / "out"
    prof = profile_session(policy(out, memory={"history": "always"},
                                  schedule={"wait": 1, "active": 1, "repeat": 1}),
                           "actor", Topology())
    with prof.training_step(2):
        cuda.out_of_memory(1 << 30)  # waiting: no cycle records, history is on all the same
    prof.close()
    (row,) = [r for r in traces(out) if r["status"] == "oom"]
    assert row["path"] == "actor_step2_rank0_oom.pickle" and row["trigger"] == "plan"
    assert row["extra"]["history"] is True


def test_history_always_without_on_oom_writes_no_dump(tmp_path: Path,
                                                     cuda: FakeCudaMemory) -> None:
    out = tmp_path / "out"
    prof = profile_session(policy(out, memory={"history": "always", "on_oom": False}),
                           "actor", Topology())
    assert cuda.enabled and cuda.observers == []
    with prof.training_step(1):
        cuda.out_of_memory(1)
    prof.close()
    assert traces(out) == []


def test_history_always_without_cuda_leaves_a_note(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING), recording_backend("torch"):
        run(policy(out, backend=["torch", "memory"], memory={"history": "always"}), None)
    notes = records(out, "note")
    assert [(n["note"], n["backend"]) for n in notes] == [
        ("left_out", "memory"), ("left_out", "memory")]
    assert notes[0]["message"].startswith("history: always: allocator history cannot be "
                                          "recorded: no CUDA device")
    assert "CUDA" in notes[1]["message"] and notes[1]["role"] == "actor"
    assert "memory history: always is off for role 'actor' on rank 0" in caplog.text
    assert [r["status"] for r in traces(out)] == ["complete", "complete"]


def test_history_always_without_cuda_raises_under_on_error_raise(tmp_path: Path) -> None:
    with pytest.raises(ProfilingError, match=r"history: always is off .* CUDA"):
        profile_session(policy(tmp_path / "out", on_error="raise",
                               memory={"history": "always"}), "actor", Topology())


def test_a_role_that_only_keeps_history_profiles_something(tmp_path: Path) -> None:
    """steps: [] with history: always watches for out-of-memory errors: no warning."""
    assert load_policy(policy(tmp_path, steps=[], memory={"history": "always"})).warnings == ()
    (found,) = load_policy(policy(tmp_path, steps=[])).warnings
    assert "steps: [] selects no step" in found.message


def test_history_setting_is_checked(tmp_path: Path) -> None:
    found = problems(policy(tmp_path, memory={"history": "forever"}))
    assert any("history must be one of capture, always" in p for p in found), found
