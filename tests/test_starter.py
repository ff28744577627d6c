"""The policy ``policy-engine init`` writes records something real the first time, however
the training code drives it: a plain loop that never calls ``prof.step()``, the torchtitan
loop inside ``with profile_session(...)``, and the Lightning and Hugging Face callbacks
(one inner step per optimizer step). And what explain says of it is what the run writes.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from test_integrations import hf_trainer, lightning_fit, lightning_module

from policy_engine import Topology, load_policy, profile_session
from policy_engine.analysis.manifests import scan_manifests
from policy_engine.cli.main import main
from policy_engine.integrations._driver import HookDriver
from policy_engine.plan.predict import explain
from policy_engine.testing import recording_backend


@pytest.fixture
def starter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """The starter policy, as ``policy-engine init`` writes it, writing under tmp_path."""
    path = tmp_path / "profile_policy.yaml"
    assert main(["init", str(path)]) == 0
    capsys.readouterr()
    return path


def records(out: Path, event: str) -> list[dict[str, Any]]:
    scan = scan_manifests(str(out))
    assert scan.problems == ()
    return [r for r in scan.records if r["event"] == event]


def explained(path: Path, role: str) -> list[str]:
    """The trace files explain lists for rank 0, as the run names them."""
    entry = explain(load_policy(path), role, world=1, lo=1, hi=6)["ranks"][0]
    return [t["name"] for t in entry["traces"]]


def named(predicted: list[str], actual: list[str]) -> bool:
    """Whether the run's names are explain's, its ``<pid>`` and ``<timestamp>`` filled."""
    patterns = [re.escape(name).replace("<pid>", r"\d+").replace("<timestamp>", r"\d{17}")
                for name in predicted]
    return len(patterns) == len(actual) and all(
        re.fullmatch(p, a) for p, a in zip(patterns, actual, strict=True))


def check_steps_2_and_3(out: Path, names: list[str]) -> None:
    """Steps 2 and 3 of the trainer, whole and complete, under the names explain gives."""
    traces = records(out, "trace")
    assert [(t["steps"], t["status"]) for t in traces] == [([2], "complete"), ([3], "complete")]
    assert named([n + ".pt.trace.json.gz" for n in names], [t["path"] for t in traces])
    assert all((out / t["path"]).is_file() and t["bytes"] for t in traces)
    assert all("reason" not in c for c in records(out, "close"))


def test_the_starter_validates_and_explains_both_roles(starter: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    text = starter.read_text()
    assert "\n  # schedule: {wait: 0, warmup: 1, active: 2, repeat: 1}\n" in text
    assert main(["validate", "--strict", str(starter)]) == 0
    capsys.readouterr()
    for role in ("trainer", "actor"):
        assert main(["explain", str(starter), "--role", role, "--world", "2",
                     "--format", "json"]) == 0
        rank0 = json.loads(capsys.readouterr().out)["ranks"][0]
        assert [t["steps"] for t in rank0["traces"]] == [[2], [3]]
        assert all(t["files"][0]["path"].endswith(".pt.trace.json.gz")
                   for t in rank0["traces"])
    # the commented schedule, once uncommented, is a valid schedule too
    uncommented = starter.parent / "scheduled.yaml"
    uncommented.write_text(text.replace("  # schedule: {", "  schedule: {"))
    assert main(["validate", "--strict", str(uncommented)]) == 0


@pytest.mark.parametrize("calls", [0, 1, 4], ids=["no prof.step()", "one", "four"])
def test_the_starter_records_a_plain_loop(starter: Path, tmp_path: Path, calls: int,
                                          caplog: pytest.LogCaptureFixture) -> None:
    """``with prof.training_step(n):`` with any number of prof.step() calls, inside
    ``with profile_session(...)`` or not: steps 2 and 3, whole, nothing else."""
    names = explained(starter, "trainer")
    with recording_backend("torch") as rec, \
            caplog.at_level(logging.WARNING, "policy_engine"), \
            profile_session(str(starter), "trainer", Topology()) as prof:
        for n in range(1, 7):
            with prof.training_step(n):
                for _ in range(calls):
                    prof.step()
    assert named(names, [c[1] for c in rec.calls if c[0] == "save"])
    out = tmp_path / "profiles"
    assert [(t["steps"], t["status"]) for t in records(out, "trace")] == [
        ([2], "complete"), ([3], "complete")]
    assert not [r for r in caplog.records if "prof.step() call" in r.getMessage()]


def test_the_starter_under_a_callback_driver(starter: Path, tmp_path: Path) -> None:
    """What both callbacks do, one inner step per optimizer step: steps 2 and 3 whole."""
    driver = HookDriver("trainer", str(starter), None)
    with recording_backend("torch") as rec:
        driver.start(Topology(rank=0, world=1))
        for n in range(1, 7):
            driver.open_step(n)
            driver.inner_step()
            driver.close_step()
        driver.finish()
    assert [i.steps for i in rec.infos] == [(2,), (3,)]
    assert [c[0] for c in rec.actions()] == ["open", "start", "save", "close"] * 2
    assert [c["status"] for c in records(tmp_path / "profiles", "close")] == ["complete"] * 2


# -- the real frameworks (slow) --------------------------------------------------------
@pytest.mark.slow
def test_the_starter_under_lightning(starter: Path, tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch")
    from policy_engine.integrations.lightning import PolicyCallback

    out = tmp_path / "profiles"
    callback = PolicyCallback(policy=str(starter))
    assert lightning_fit(out, callback, lightning_module(), micro=1).global_step == 6
    check_steps_2_and_3(out, explained(starter, "trainer"))


@pytest.mark.slow
def test_the_starter_under_hugging_face(starter: Path, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from policy_engine.integrations.transformers import PolicyCallback

    out = tmp_path / "profiles"
    trainer = hf_trainer(out, [PolicyCallback(policy=str(starter))], micro=1)
    assert trainer.train().global_step == 6
    check_steps_2_and_3(out, explained(starter, "trainer"))


@pytest.mark.slow
def test_a_schedule_too_long_for_a_callback_says_why(
        starter: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The starter's commented schedule, uncommented, under Lightning (one inner step a
    step): each step's trace is cut short, and the run says so once, naming the schedule."""
    pytest.importorskip("lightning.pytorch")
    from policy_engine.integrations.lightning import PolicyCallback

    starter.write_text(starter.read_text().replace("  # schedule: {", "  schedule: {"))
    out = tmp_path / "profiles"
    with caplog.at_level(logging.WARNING, "policy_engine"):
        lightning_fit(out, PolicyCallback(policy=str(starter)), lightning_module(), micro=1)
    warned = [r.getMessage() for r in caplog.records if "prof.step() call" in r.getMessage()]
    assert len(warned) == 1
    assert "capture of step 2 ended at inner step 1 (after 1 prof.step() call)" in warned[0]
    assert "{warmup: 1, active: 2, repeat: 1}" in warned[0]
    assert [t["status"] for t in records(out, "trace")] == ["partial", "partial"]
    assert [c["reason"].split(" ended")[0] for c in records(out, "close")] == [
        "capture of step 2", "capture of step 3"]
