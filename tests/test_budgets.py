"""``limits`` is a budget per role and process: it holds with background export (exports
still being written count), and every profiler of a role in one process shares it."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from policy_engine import Topology, apply_policy, profile_session
from policy_engine.analysis.manifests import scan_manifests
from policy_engine.backends.base import Artifact, CaptureInfo
from policy_engine.files.publish import write_atomic
from policy_engine.runtime.process import budget, state
from policy_engine.runtime.process.state import slot
from policy_engine.testing import RecordingBackend, RecordingSession, recording_backend


class Worker:
    pass


def traces(out: Path) -> list[dict[str, Any]]:
    return [r for r in scan_manifests(str(out)).records
            if r["event"] == "trace" and r.get("path")]


def notes(out: Path) -> list[dict[str, Any]]:
    return [r for r in scan_manifests(str(out)).records if r["event"] == "note"]


def run(prof: Any, steps: range) -> None:
    for n in steps:
        with prof.training_step(n):
            prof.step()
    prof.close()


class LateSession(RecordingSession):
    """A recording session whose files are written later, by the export thread, as the
    torch backend's are: ``save_later`` stops, the closure it returns writes."""

    saves_later = True

    def save(self, stem: str, cycle: int) -> list[Artifact]:  # export: {mode: sync}
        return self.save_later(stem, cycle)()

    def save_later(self, stem: str, cycle: int) -> Callable[[], list[Artifact]]:
        self._call("save_later", stem, cycle)
        late: LateBackend = self.backend  # type: ignore[assignment]

        def write() -> list[Artifact]:
            time.sleep(late.delay)  # a large trace on a slow disk
            path, size = write_atomic(self.info.output_dir, stem, ".rec",
                                      lambda p: Path(p).write_bytes(b"x" * late.size))
            late.written.append(threading.current_thread().name)
            return [Artifact(path, size)]
        return write


class LateBackend(RecordingBackend):
    def __init__(self, size: int, delay: float) -> None:
        super().__init__()
        self.size, self.delay = size, delay
        self.written: list[str] = []

    def open(self, info: CaptureInfo) -> LateSession:
        super().open(info)
        return LateSession(self, info)


@pytest.fixture
def late() -> Iterator[LateBackend]:
    target = slot("torch")
    previous, backend = target.backend, LateBackend(size=100, delay=0.3)
    target.backend = backend
    yield backend
    state.reset()
    target.backend = previous


@pytest.mark.parametrize("mode", ["sync", "background"])
@pytest.mark.parametrize(("limit", "expected"), [(1, 1), (150, 2), (250, 3)])
def test_bytes_hold_in_both_export_modes(make_policy: Any, tmp_path: Path, late: LateBackend,
                                         mode: str, limit: int, expected: int) -> None:
    """Traces of 100 bytes under a byte budget: the same count in both modes (the budget
    passed by at most the one trace under way), though the background writes lag."""
    policy = make_policy(steps="1-10", limits={"bytes": limit}, export={"mode": mode})
    prof = profile_session(policy, "actor", Topology(rank=0, world=1))
    run(prof, range(12))
    assert len(traces(tmp_path / "out")) == expected
    assert set(late.written) == {
        "policy-engine-export" if mode == "background" else "MainThread"}
    [note] = notes(tmp_path / "out")
    assert f"limits.bytes: {expected * 100} bytes written" in note["message"]


def test_an_export_that_never_ends_is_counted_as_spending(
        make_policy: Any, tmp_path: Path, late: LateBackend,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(budget, "EXPORT_WAIT", 0.05)
    late.delay = 1.0
    policy = make_policy(steps="1-10", limits={"bytes": "1MB"})
    prof = profile_session(policy, "actor", Topology(rank=0, world=1))
    run(prof, range(4))
    [note] = notes(tmp_path / "out")
    assert "1 trace(s) still being written after 0.05 s" in note["message"]
    assert len(traces(tmp_path / "out")) == 1


@pytest.mark.parametrize("how", ["profile_session", "apply_policy"])
def test_a_role_opened_twice_in_a_process_shares_one_budget(
        make_policy: Any, tmp_path: Path, how: str) -> None:
    policy = make_policy(steps=[1, 2, 3], limits={"captures": 1})
    with recording_backend("torch"):
        for _ in range(2):
            if how == "apply_policy":
                prof = apply_policy(Worker(), "actor", policy, Topology(rank=0, world=1))
            else:
                prof = profile_session(policy, "actor", Topology(rank=0, world=1))
            run(prof, range(5))
    assert len(traces(tmp_path / "out")) == 1
    assert len(notes(tmp_path / "out")) == 1  # one warning's worth: the limit, once


def test_other_roles_and_a_fresh_state_have_their_own(make_policy: Any, tmp_path: Path) -> None:
    policy = make_policy(steps=[1], limits={"captures": 1})
    policy["roles"]["critic"] = dict(policy["roles"]["actor"])
    with recording_backend("torch"):
        run(profile_session(policy, "actor", Topology(rank=0, world=1)), range(3))
        run(profile_session(policy, "critic", Topology(rank=0, world=1)), range(3))
    state.reset()
    with recording_backend("torch"):
        run(profile_session(policy, "actor", Topology(rank=0, world=1)), range(3))
    assert len(traces(tmp_path / "out")) == 3


def test_a_forked_child_starts_its_own_spend() -> None:
    spent = budget.spend_of("actor")
    spent.cycles = 5
    assert budget.spend_of("actor") is spent
    state.STATE.budgets[(os.getpid() + 1, "actor")] = spent  # as a parent's entry looks
    assert budget.spend_of("critic") is not spent


@pytest.mark.slow
@pytest.mark.parametrize("limit", ["1", "20KB"])
def test_real_torch_traces_stop_at_the_same_count_in_both_modes(
        make_policy: Any, tmp_path: Path, limit: str) -> None:
    pytest.importorskip("torch")
    import torch

    counts = {}
    for mode in ("sync", "background"):
        out = tmp_path / mode
        policy = make_policy(steps="1-8", limits={"bytes": limit}, export={"mode": mode})
        policy["output_dir"] = str(out)
        prof = profile_session(policy, "actor", Topology(rank=0, world=1))
        for n in range(10):
            with prof.training_step(n):
                torch.randn(64, 64).matmul(torch.randn(64, 64)).sum()
                prof.step()
        prof.close()
        counts[mode] = len(traces(out))
        state.reset()
    assert counts["background"] == counts["sync"], counts
    if limit == "1":
        assert counts == {"sync": 1, "background": 1}
