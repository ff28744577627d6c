"""Collective calls across the ranks of real 4-rank torchrun jobs (gloo, CPU): every rank
works in its ``work`` region and then all-reduces, rank 2 working three times as long
(tests/dist_scripts/collectives_worker.py). The engine's torch captures note each call's
group, sequence number and bytes (runtime/capture/collective_notes.py); each rank's trace
is read into its record (analysis/collectives.py) and the records alone are matched
(analysis/matching.py).

- one group: rank 2 arrived last in at least 90% of the matched calls, is the late rank
  of the vote, and its work is the cause; the other ranks' wait is within 20% of rank 2's
  extra work, rank 2's near 0;
- two groups (tensor-parallel pairs, then data-parallel pairs): every call is matched
  within its own group, and each group has its bus bandwidth.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from job_env import child_env

from policy_engine.analysis.chrome_trace import TraceReader
from policy_engine.analysis.collective_form import read, runs_ranks
from policy_engine.analysis.collectives import Collectives
from policy_engine.analysis.matching import Matcher, RankWork

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "dist_scripts" / "collectives_worker.py"
WORK_MS, FACTOR, SLOW, INNER = 30, 3, 2, 21
POLICY = f"""\
version: 1
output_dir: profiles
roles:
  trainer:
    enabled: true
    ranks: all
    steps: [2]
    regions: [work]
    schedule: {{warmup: 1, active: {INNER - 1}, repeat: 1}}
    torch: {{activities: [cpu]}}
"""


def run(folder: Path, mode: str) -> list[Path]:
    """The job in ``folder``; its four traces, rank by rank."""
    folder.mkdir()
    (folder / "policy.yaml").write_text(POLICY)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
         str(WORKER), "policy.yaml", mode, str(SLOW), str(FACTOR), str(WORK_MS), "2",
         str(INNER)], cwd=folder, env=child_env(), capture_output=True, text=True,
        timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    traces = sorted(folder.glob("profiles/**/*.pt.trace.json.gz"))
    assert len(traces) == 4, traces
    return sorted(traces, key=lambda p: int(re.search(r"rank(\d+)", p.name).group(1)))


def read_rank(path: Path) -> tuple[dict[str, Any], dict[str, Any], float]:
    """A rank's record, its trace's metadata, and its time in the ``work`` region."""
    found = Collectives()
    work = 0.0
    with TraceReader(str(path)) as reader:
        for event in reader.events():
            found.event(event)
            if event.get("name") == "work" and event.get("ph") == "X":
                work += event["dur"]
        meta = reader.meta
    return found.result(meta), meta, work


def matched(traces: list[Path]) -> tuple[Matcher, list[dict[str, Any]], dict[int, RankWork]]:
    matcher, records, work = Matcher(), [], {}
    for rank, path in enumerate(traces):
        record, meta, region = read_rank(path)
        notes = meta["policy_engine"]["collectives"]
        assert notes["from"] == "flight_recorder" and notes["calls"], notes
        # what a summary read back from a manifest gives: JSON, checked
        matcher.add(rank, read(json.loads(json.dumps(record))))
        records.append(record)
        work[rank] = RankWork(regions={"work": region})
    return matcher, records, work


@pytest.fixture(scope="module")
def one_group(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return run(tmp_path_factory.mktemp("collectives") / "one", "one")


@pytest.fixture(scope="module")
def two_groups(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return run(tmp_path_factory.mktemp("collectives") / "two", "two")


def test_rank_2_arrives_last_and_the_others_wait_for_its_extra_work(
        one_group: list[Path]) -> None:
    matcher, records, work = matched(one_group)
    for record in records:
        assert (record["source"], record["numbered"]) == ("gloo", "seq")
        assert [(g["name"], runs_ranks(g["ranks"])) for g in record["groups"]] == \
            [("0", [0, 1, 2, 3])]
        assert not record["problems"]
    out = matcher.result(work=work, steps=INNER - 1)
    calls = out["calls"]["matched"]
    assert calls == INNER - 1 and out["calls"]["incomplete"] == 0
    assert out["ranks"]["2"]["last"] >= 0.9 * calls, out["ranks"]
    assert out["late"]["rank"] == SLOW, out["late"]
    assert out["late"]["cause"]["kind"] == "work", out["late"]
    assert out["late"]["cause"]["region"] == "work"
    # rank 2's extra work: its work region less the other ranks' median, measured
    extra = work[SLOW].regions["work"] - statistics.median(
        w.regions["work"] for r, w in work.items() if r != SLOW)
    assert extra == pytest.approx((FACTOR - 1) * WORK_MS * 1000 * calls, rel=0.25)
    waits = {int(r): f["wait_per_step_us"] for r, f in out["ranks"].items()}
    for rank in (0, 1, 3):
        assert waits[rank] == pytest.approx(extra / calls, rel=0.2), (waits, extra)
    assert waits[SLOW] <= 0.05 * statistics.mean(waits[r] for r in (0, 1, 3)), waits
    assert out["groups"][0]["name"] == "0" and out["groups"][0]["busbw_gbps"] > 0


def test_two_groups_calls_are_matched_within_their_own_group(
        two_groups: list[Path]) -> None:
    matcher, records, work = matched(two_groups)
    members: dict[str, list[int]] = {}
    for rank, record in enumerate(records):
        assert not record["problems"]
        for g in record["groups"]:
            ranks = runs_ranks(g["ranks"])
            assert rank in ranks
            assert members.setdefault(g["name"], ranks) == ranks
    assert sorted(members.values()) == [[0, 1], [0, 2], [1, 3], [2, 3]]
    out = matcher.result(work=work, steps=INNER - 1)
    assert out["calls"]["matched"] == 4 * (INNER - 1)
    assert out["calls"]["incomplete"] == out["calls"]["inconsistent"] == 0
    calls = matcher.calls()
    for rank in range(4):
        mine = matcher.rank_calls(rank)
        assert set(mine["group"]) == {g for g, r in members.items() if rank in r}
        assert len(mine["group"]) == 2 * (INNER - 1)
    assert set(calls["ranks"]) == {2}
    assert {g["name"] for g in out["groups"]} == set(members)
    assert all(g["busbw_gbps"] and g["busbw_gbps"] > 0 and g["calls"] == INNER - 1
               for g in out["groups"]), out["groups"]
    assert out["late"]["rank"] == SLOW, out["late"]


def _analyze(folder: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "policy_engine", "analyze",
                           str(folder / "profiles"), "--format", "json", "--jobs", "1"],
                          env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_analyze_says_it_from_the_summaries(one_group: list[Path], two_groups: list[Path]
                                           ) -> None:
    """``policy-engine analyze``, from each rank's summary in the manifests (no trace read:
    they are removed first), says the same: rank 2 arrived last in at least 90% of the
    calls, its work region is the cause, the others' wait per step is its extra work
    within 20%, its own near 0; with two groups, every call is matched in its own group
    and each group has its bus bandwidth; the text says who and why."""
    for traces in (one_group, two_groups):
        for path in traces:
            path.unlink()
    folder = next(p for p in one_group[0].parents if p.name == "one")
    (w,) = _analyze(folder)["windows"]
    calls = w["collectives"]
    matched = calls["calls"]["matched"]
    assert matched == INNER - 1 and calls["calls"]["incomplete"] == 0
    assert calls["late"]["rank"] == SLOW and calls["ranks"][str(SLOW)]["last"] >= 0.9 * matched
    assert calls["late"]["cause"]["kind"] == "work" and calls["late"]["cause"]["region"] == "work"
    extra = (FACTOR - 1) * WORK_MS * 1000
    for rank in ("0", "1", "3"):
        assert calls["ranks"][rank]["wait_per_step_us"] == pytest.approx(extra, rel=0.25)
    assert calls["ranks"][str(SLOW)]["wait_per_step_us"] < 0.1 * extra
    assert len(calls["calls"]["table"]["number"]) == matched
    text = subprocess.run([sys.executable, "-m", "policy_engine", "analyze",
                           str(folder / "profiles")], env=child_env(), capture_output=True,
                          text=True, timeout=300).stdout
    assert f"LATE RANK: rank {SLOW} arrived last in" in text
    assert "because its region 'work' took" in text
    (w,) = _analyze(next(p for p in two_groups[0].parents if p.name == "two"))["windows"]
    groups = w["collectives"]["groups"]
    assert len(groups) == 4 and all(g["busbw_gbps"] and g["size"] == 2 for g in groups)
    assert w["collectives"]["calls"]["matched"] == 4 * (INNER - 1)
