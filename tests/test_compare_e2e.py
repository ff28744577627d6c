"""policy-engine compare on real 4-rank torchrun jobs (gloo, CPU): extra matrix
multiplications in one region on every rank are `slower`, put down to compute in that
region and to aten::mm; the same job twice is `no change`; a slow rank added shows as the
straggler change; another world size or other activities withhold the verdict.
benchmarks/bench_compare.py repeats the first two 20 times each. The jobs are shared with
test_analyze_e2e and test_summaries_e2e (compare_jobs.JOBS)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
from compare_jobs import SLOW, StragglerJobs, compare
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


def test_the_same_job_twice_is_no_change(straggler_jobs: StragglerJobs) -> None:
    for w in _windows(straggler_jobs["base"], straggler_jobs["again"]):
        assert w["verdict"] == "no change", w["why"]
        assert w["why"].startswith("within noise")


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
