"""The nsight backend with a fake nvtx module: capture ranges, regions, report names.

The real tool runs in test_nsys_e2e.py; these tests need neither nsys nor nvtx.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from policy_engine import Topology, compile_plan, load_policy, profile_session
from policy_engine.analysis.manifests import read_manifests
from policy_engine.backends.base import BackendUnavailable, CaptureInfo
from policy_engine.backends.nsight import session as nsight
from policy_engine.files.records import Status
from policy_engine.runtime.process.state import slot
from policy_engine.settings import nsight as nsight_checks

CAPTURE = ("policy_engine.capture", "policy_engine")


class FakeNvtx(types.ModuleType):
    """Records calls in the shape of nvtx 0.2's API."""

    def __init__(self) -> None:
        super().__init__("nvtx")
        self.events: list[tuple[Any, ...]] = []
        self._ids = 0

    def start_range(self, message: str, color: Any = None, domain: str | None = None) -> int:
        self._ids += 1
        self.events.append(("start", message, domain))
        return self._ids

    def end_range(self, range_id: int) -> None:
        self.events.append(("end", range_id))

    def mark(self, message: str, color: Any = None, domain: str | None = None) -> None:
        self.events.append(("mark", message.split(" ")[0], domain))


@pytest.fixture
def nvtx(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvtx]:
    """A fake nvtx, a process that looks like it runs under nsys, a fresh backend."""
    fake = FakeNvtx()
    monkeypatch.setitem(sys.modules, "nvtx", fake)
    monkeypatch.setenv(nsight.ENV_SESSION, "1")
    monkeypatch.setenv(nsight.ENV_RANGE, "policy_engine.capture")
    monkeypatch.setenv(nsight.ENV_DOMAIN, "policy_engine")
    target = slot("nsight")
    previous, target.backend = target.backend, nsight.NsightBackend()
    yield fake
    if target.capture is not None:
        target.capture.end(Status.PARTIAL)
    target.backend = previous


def policy(out: Path, **role: Any) -> dict[str, Any]:
    body = {
        "enabled": True,
        "backend": "nsight",
        "steps": [1, 3],
        "regions": ["update"],
        "nsight": {"domain": "train"},
        **role,
    }
    return {"version": 1, "prefix": "p", "output_dir": str(out), "roles": {"actor": body}}


def info(out: Path, settings: dict[str, Any]) -> CaptureInfo:
    return CaptureInfo("actor", 0, 1, {}, None, (1,), str(out), settings, "h", "warn")


def session_settings(out: Path, **role: Any) -> dict[str, Any]:
    plan = compile_plan(load_policy(policy(out, **role)), "actor", Topology(0, 1))
    return nsight.session_settings(plan)


# ---------------------------------------------------------------- sessions


def test_capture_range_regions_and_steps(tmp_path: Path, nvtx: FakeNvtx) -> None:
    settings = session_settings(tmp_path)
    assert settings["output"] == f"{tmp_path}/actor/p_rank0-of-1_pid%p"
    assert settings["planned_ranges"] == 2
    backend = nsight.NsightBackend()
    session = backend.open(info(tmp_path, settings))
    with session.range("outside"):  # not capturing: no range
        pass
    session.start()
    with session.range("update"):
        session.step(0)
    artifacts = session.save("stem", 0)
    session.close()
    assert nvtx.events == [
        ("start", *CAPTURE),
        ("mark", "policy_engine", "policy_engine"),
        ("start", "update", "train"),  # start/end: the range may close on another thread
        ("start", "ProfilerStep#0", "train"),
        ("end", 2),
        ("end", 3),
        ("end", 1),
    ]
    [artifact] = artifacts
    assert artifact.path == f"{tmp_path}/actor/p_rank0-of-1_pid{os.getpid()}.1.nsys-rep"
    assert artifact.extra == {"capture_range": 0, "cycle": 0, "report": Path(artifact.path).name}
    second = backend.open(info(tmp_path, settings))
    second.start()
    assert second.save("stem", 0)[0].extra["capture_range"] == 1


@pytest.mark.parametrize(
    ("role", "name"),
    [
        ({"steps": [1]}, "x.nsys-rep"),  # one report: no number
        ({"nsight": {"capture_range_end": "stop"}}, "x.nsys-rep"),  # stop: the first only
        ({}, "x.1.nsys-rep"),
    ],
)
def test_report_numbering(tmp_path: Path, nvtx: FakeNvtx, role: dict[str, Any], name: str) -> None:
    settings = {**session_settings(tmp_path, **role), "output": str(tmp_path / "x")}
    session = nsight.NsightBackend().open(info(tmp_path, settings))
    session.start()
    assert Path(session.save("s", 0)[0].path).name == name


def test_region_range_closes_on_exception(tmp_path: Path, nvtx: FakeNvtx) -> None:
    session = nsight.NsightBackend().open(info(tmp_path, session_settings(tmp_path)))
    session.start()
    with pytest.raises(KeyError), session.range("update"):
        raise KeyError("boom")
    assert nvtx.events[-1] == ("end", 2)
    session.discard()  # nsys cannot forget a range: discarding still closes it
    assert nvtx.events[-1] == ("end", 1)
    assert session.save("s", 0) == []
    session.close()


def test_output_folder_made_before_the_capture(tmp_path: Path, nvtx: FakeNvtx) -> None:
    settings = {**session_settings(tmp_path), "output": str(tmp_path / "a" / "b" / "x_%p")}
    session = nsight.NsightBackend().open(info(tmp_path, settings))
    session.start()
    assert (tmp_path / "a" / "b").is_dir()


# ---------------------------------------------------------------- through the runtime


def test_runtime_records_capture_range_per_step(tmp_path: Path, nvtx: FakeNvtx) -> None:
    prof = profile_session(policy(tmp_path), "actor", Topology(0, 1))
    for n in range(5):
        with prof.training_step(n), prof.region("update"):
            prof.step()
    prof.close()
    rows = sorted(read_manifests(str(tmp_path)), key=lambda r: r["start"])
    assert [(r["steps"], r["extra"]["capture_range"]) for r in rows] == [([1], 0), ([3], 1)]
    assert [e for e in nvtx.events if e[0] == "start" and e[1] == CAPTURE[0]] == [
        ("start", *CAPTURE)
    ] * 2
    # regions of unprofiled steps leave nothing behind
    assert sum(1 for e in nvtx.events if e[:2] == ("start", "update")) == 2


def test_not_under_nsys_is_one_warning(
    tmp_path: Path,
    nvtx: FakeNvtx,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.delenv(nsight.ENV_SESSION)
    prof = profile_session(policy(tmp_path), "actor", Topology(0, 1))
    with caplog.at_level(logging.WARNING, "policy_engine"):
        for n in range(5):
            with prof.training_step(n):
                prof.step()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1
    assert "does not run under `nsys profile`" in messages[0]
    assert nvtx.events == []


# ---------------------------------------------------------------- what stops it


def test_launch_waiting_for_another_range(
    tmp_path: Path, nvtx: FakeNvtx, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(nsight.ENV_RANGE, "train_step")
    with pytest.raises(
        BackendUnavailable,
        match=re.escape(
            "nsys waits for the NVTX range train_step@policy_engine but the engine opens "
            "policy_engine.capture@policy_engine"
        ),
    ):
        nsight.NsightBackend().open(info(tmp_path, {"capture": "nvtx"}))


def test_missing_nvtx(tmp_path: Path, nvtx: FakeNvtx, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nvtx", None)
    with pytest.raises(BackendUnavailable, match="pip install nvtx"):
        nsight.NsightBackend().open(info(tmp_path, session_settings(tmp_path)))


def test_cuda_profiler_api_needs_cuda(tmp_path: Path, nvtx: FakeNvtx) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    settings = {**session_settings(tmp_path), "capture": "cuda_profiler_api"}
    with pytest.raises(BackendUnavailable, match="needs a CUDA device"):
        nsight.NsightBackend().open(info(tmp_path, settings))


def test_check_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nvtx", None)
    monkeypatch.setattr(nsight_checks.glob, "glob", lambda pattern: [])  # no /dev/nvidia*
    assert nsight_checks.check_runtime({"capture": "nvtx"}) == [
        "nvtx is not installed: pip install nvtx"]
    assert nsight_checks.check_runtime({"capture": "cuda_profiler_api", "ranges": False}) == [
        "capture cuda_profiler_api needs a CUDA device; use capture: nvtx (or auto) without one"
    ]


def test_existing_report_is_a_warning(
    tmp_path: Path, nvtx: FakeNvtx, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "x.1.nsys-rep").write_text("")
    settings = {**session_settings(tmp_path), "output": str(tmp_path / "x")}
    session = nsight.NsightBackend().open(info(tmp_path, settings))
    with caplog.at_level(logging.WARNING, "policy_engine"):
        session.start()
    assert [r.getMessage() for r in caplog.records] == [
        f"policy-engine: {tmp_path}/x.1.nsys-rep exists already; nsys never overwrites it "
        "and writes this process's reports to /tmp/nsys-report-*.nsys-rep instead"
    ]


def test_failed_start_closes_what_it_opened(tmp_path: Path, nvtx: FakeNvtx) -> None:
    class BrokenCuda:
        def start(self) -> None:
            raise RuntimeError("cudaProfilerStart failed")

        def stop(self) -> None:
            pass

    backend = nsight.NsightBackend()
    settings = session_settings(tmp_path)
    backend.open(info(tmp_path, settings))
    session = nsight.NsightSession(backend, info(tmp_path, settings), nvtx, BrokenCuda())
    with pytest.raises(RuntimeError, match="cudaProfilerStart failed"):
        session.start()
    assert nvtx.events == [("start", *CAPTURE), ("end", 1)]
    assert not session.recording


def test_a_dropped_provisional_session_capture_leaves_no_range(
        tmp_path: Path, nvtx: FakeNvtx) -> None:
    """``with profile_session(...)`` around a loop of training steps: the whole-session
    capture is dropped at the first ``training_step``, and nsys must not have seen a
    range for it (it would write a report for it, and number the per-step ones after it)."""
    with profile_session(policy(tmp_path), "actor", Topology(0, 1)) as prof:
        for n in range(5):
            with prof.training_step(n), prof.region("update"):
                prof.step()
    starts = [e for e in nvtx.events if e[0] == "start"]
    assert [e for e in starts if e[1] == CAPTURE[0]] == [("start", *CAPTURE)] * 2
    ends = [e for e in nvtx.events if e[0] == "end"]
    assert len(ends) == len(starts)  # every range it opened, closed
    rows = sorted(read_manifests(str(tmp_path)), key=lambda r: r["start"])
    assert [(r["steps"], r["extra"]["capture_range"]) for r in rows] == [([1], 0), ([3], 1)]


def test_a_kept_session_capture_records_from_the_first_step(
        tmp_path: Path, nvtx: FakeNvtx) -> None:
    """A plain loop (``step()`` only): the session capture is kept, and under nsight its
    one range opens at the first ``step()``."""
    with profile_session(policy(tmp_path, steps="all"), "actor", Topology(0, 1)) as prof:
        assert not [e for e in nvtx.events if e[0] == "start"]  # provisional: no range yet
        for _ in range(3):
            with prof.region("update"):
                prof.step()
    assert [e for e in nvtx.events if e[0] == "start" and e[1] == CAPTURE[0]] == [
        ("start", *CAPTURE)]
    [row] = read_manifests(str(tmp_path))
    assert row["status"] == "complete" and row["extra"]["capture_range"] == 0
