"""policy-engine compare on real 4-rank torchrun jobs (gloo, CPU): extra matrix
multiplications in one region on every rank are `slower`, put down to compute in that
region and to aten::mm; about 60% more work in 8 steps a window is `slower` or
`inconclusive`, never `no change`; the same job twice is never `slower` or `faster`; a
slow rank added shows as the straggler change; another world size or other activities
withhold the verdict; two demo runs into two folders are one policy.
benchmarks/bench_compare.py repeats the 60% change 10 times and the same job twice 20
times. The jobs are shared with test_analyze_e2e and test_summaries_e2e
(compare_jobs.JOBS)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
from compare_jobs import SLOW, StragglerJobs, compare
from job_env import run_cli
from test_compare import SCHEMA

pytestmark = pytest.mark.slow


def _windows(base: Path, new: Path) -> list[dict[str, Any]]:
    result = compare(base, new)
    jsonschema.validate(result, SCHEMA)
    assert len(result["windows"]) == 2
    return list(result["windows"])


def test_extra_matrix_multiplications_are_slower_in_compute_and_mm(
        straggler_jobs: StragglerJobs) -> None:
    for w in _windows(straggler_jobs["base"], straggler_jobs["mm"]):
        assert w["verdict"] == "slower", w["why"]
        parts = w["parts"]
        assert parts["compute_us"] == max(parts.values())  # the change is compute
        assert w["regions"][0]["name"] == "update_actor" and w["regions"][0]["change_us"] > 0
        grown = [o["name"] for o in w["operators"] if o["change_us"] > 0]
        assert {"aten::mm", "aten::matmul"} & set(grown), grown


def test_the_same_job_twice_is_never_slower_or_faster(straggler_jobs: StragglerJobs) -> None:
    for w in _windows(straggler_jobs["base"], straggler_jobs["again"]):
        assert w["verdict"] in ("no change", "inconclusive"), w["why"]
        _says_what_it_could_tell(w)


def _says_what_it_could_tell(w: dict[str, Any]) -> None:
    """A verdict short of slower or faster says the change, p and the steps it used; an
    inconclusive one also what held it back and what more steps would do."""
    t = w["test"]
    assert w["why"].startswith(f"median step time {t['change']:+.1%} (p = "), w["why"]
    assert f"{t['base_steps']} and {t['new_steps']} steps" in w["why"]
    if w["verdict"] == "no change":
        assert t["detectable"] <= t["min_change"]
    elif t["decide_steps"] is not None:
        assert f"; about {t['decide_steps']} steps a side would decide)" in w["why"]
    else:  # no count of steps would, or the windows of the role disagree
        assert any(s in w["why"] for s in ("would not decide", "would be needed")) or (
            t["agree"] is False and "tell their change apart from this one" in w["why"]), \
            w["why"]


def test_sixty_percent_more_work_in_few_steps_is_never_no_change(
        straggler_jobs: StragglerJobs) -> None:
    """8 steps a window (7 compared) are as few as the test decides on: each window is
    slower, or says it cannot tell; the windows of the role that can tell are not turned
    to no change by those that cannot. A window called slower measured much of the 60%;
    one that cannot tell says what its steps could call, whatever change it measured: on
    a loaded machine the medians of 7 steps took +12.7% of the 60% once and -4.2% another
    time (one run's own windows 20% apart), which is why it cannot tell."""
    windows = _windows(straggler_jobs["few"], straggler_jobs["some"])
    for w in windows:
        assert w["verdict"] in ("slower", "inconclusive"), w["why"]
        if w["verdict"] == "slower":
            assert w["test"]["change"] > 0.2, w["why"]
        else:
            _says_what_it_could_tell(w)


def test_a_slow_rank_added_is_the_straggler_change(straggler_jobs: StragglerJobs) -> None:
    for w in _windows(straggler_jobs["base"], straggler_jobs["slow"]):
        assert w["straggler"] == {"base": None, "new": SLOW, "changed": True}


def test_another_world_size_withholds_the_verdict(straggler_jobs: StragglerJobs) -> None:
    for w in _windows(straggler_jobs["base"], straggler_jobs["two"]):
        assert w["verdict"] is None and not w["comparable"]
        assert [d["what"] for d in w["differences"] if d["blocks"]] == ["world"]
        assert "world size 4 -> 2" in w["why"]


def test_other_activities_withhold_the_verdict(straggler_jobs: StragglerJobs) -> None:
    for w in _windows(straggler_jobs["base"], straggler_jobs["shapes"]):
        assert w["verdict"] is None and not w["comparable"]
        (d,) = [d for d in w["differences"] if d["blocks"]]
        assert d["what"] == "recorded" and d["message"] == "what the profiler recorded differs"
        assert d["base"][0]["activities"] == ["cpu"]
        assert d["new"][0]["activities"] == ["cpu", "cuda"]
        assert d["new"][0]["record_shapes"] is True


def test_two_demo_runs_into_two_folders_are_one_policy(tmp_path: Path) -> None:
    """Only ``--out`` differs: compare names no policy difference."""
    for out in ("a", "b"):
        done = run_cli("demo", "--out", str(tmp_path / out), cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stderr
    result = compare(tmp_path / "a", tmp_path / "b")
    jsonschema.validate(result, SCHEMA)
    assert result["windows"]
    for w in result["windows"]:
        assert [d for d in w["differences"] if d["what"] == "policy"] == [], w["differences"]
