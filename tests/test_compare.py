"""policy-engine compare on generated runs: the verdict and its noise gate, the change split
into parts that sum to it, regions and operators matched by name, the straggler then and
now, differences that withhold a verdict, steps paired by hand, runs kept as summaries
only, and the JSON's shape against schemas/compare.schema.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from analysis_traces import make_run, make_summarised_run
from job_env import run_cli

from policy_engine.analysis import AnalysisError
from policy_engine.analysis.compare import agree, compare_runs, rank_sum, verdict

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "schemas" / "compare.schema.json").read_text())
SHAPE = {"steps": 10, "ops": 30, "gpu": True}


def _run(path: Path, world: int = 4, **shape: Any) -> str:
    make_run(str(path), world, **{**SHAPE, **shape})
    return str(path)


def _compare(base: str, new: str, **kw: Any) -> dict[str, Any]:
    result = compare_runs(base, new, **kw)
    jsonschema.validate(result, SCHEMA)
    return result


def test_the_rank_sum_test_gives_the_textbook_p_values() -> None:
    # scipy.stats.mannwhitneyu(method="asymptotic") on the same samples: 0.0273034...
    assert rank_sum([1, 1, 2, 2, 3, 3, 3, 4], [2, 3, 3, 4, 4, 5, 5, 5]) \
        == pytest.approx(0.027303402992194, rel=1e-9)
    assert rank_sum([5.0] * 6, [5.0] * 6) == 1.0
    assert rank_sum([1, 2], [3, 4, 5]) is None
    same = verdict([10.0, 10.1, 9.9, 10.0, 10.2, 10.1, 9.8],
                   [10.1, 10.0, 9.9, 10.1, 10.0, 10.2, 9.9])
    assert same["verdict"] == "no change" and same["why"].startswith("within noise")
    # significant but small: under the 5% floor, no change
    small = verdict([100.0 + i / 100 for i in range(40)], [102.0 + i / 100 for i in range(40)])
    assert small["verdict"] == "no change" and "under 5%" in small["why"]
    # significant and large, but the steps spread wider than the shift: no change
    wide = [60.0 + 4 * i for i in range(20)]  # 60 .. 136, median 98
    shifted = [v + 12 for v in wide]  # median 110: +12%, inside the base's middle half
    spread = verdict(wide * 5, shifted * 5)
    assert spread["test"]["p"] < 0.005 and not spread["test"]["apart"]
    assert spread["verdict"] == "no change" and "middle half" in spread["why"]
    # six steps a side cannot reach p < 0.005 even fully apart: no verdict, and it says so
    few = verdict([10.0] * 6, [20.0] * 6)
    assert few["verdict"] is None and "too few steps" in few["why"]
    assert verdict([10.0] * 7, [20.0] * 7)["verdict"] == "slower"
    # every step apart, but one run's own windows lie 50% apart: the machine, not a change
    drifted = verdict([10.0 + i / 10 for i in range(9)], [13.0 + i / 10 for i in range(9)],
                      drift=0.5)
    assert drifted["verdict"] == "no change" and drifted["test"]["drift"] == 0.5
    assert "no larger than the 50% by which one run's own windows differ" in drifted["why"]
    assert verdict([10.0 + i / 10 for i in range(9)], [13.0 + i / 10 for i in range(9)],
                   drift=0.1)["verdict"] == "slower"


def test_more_compute_is_slower_and_the_change_is_compute(tmp_path: Path) -> None:
    base = _run(tmp_path / "base")
    new = _run(tmp_path / "new", compute_us=8000.0)
    result = _compare(base, new)
    (w,) = result["windows"]
    assert w["comparable"] and w["differences"] == []
    assert w["verdict"] == "slower" and w["test"]["p"] < 0.005
    # the sample is the step (4 ranks' n-th step counted once), less the capture's first
    assert (w["test"]["base_steps"], w["test"]["new_steps"]) == (9, 9)
    parts, change = w["parts"], w["step_time"]["change_us"]
    assert sum(parts.values()) == pytest.approx(change, abs=0.01)
    assert parts["compute_us"] == pytest.approx(change, rel=0.05)  # all of it is compute
    assert w["regions"][0]["name"] == "update_actor" and w["regions"][0]["change_us"] > 0
    grown = [o for o in w["operators"] if o["change_us"] > 0]
    assert grown[0]["cat"] == "kernel" and "gemm" in grown[0]["name"]
    assert "aten::linear" in [o["name"] for o in grown]
    assert w["straggler"] == {"base": None, "new": None, "changed": False}
    back = _compare(new, base)["windows"][0]
    assert back["verdict"] == "faster" and back["parts"]["compute_us"] < 0


def test_the_same_run_twice_is_no_change(tmp_path: Path) -> None:
    base, new = _run(tmp_path / "a"), _run(tmp_path / "b")
    (w,) = _compare(base, new)["windows"]
    assert w["verdict"] == "no change" and w["step_time"]["change_us"] == 0
    assert all(v == 0 for v in w["parts"].values())


def test_a_slow_rank_added_is_the_straggler_change(tmp_path: Path) -> None:
    base = _run(tmp_path / "base")
    new = _run(tmp_path / "new", slow=2, extra_us=3000.0)
    (w,) = _compare(base, new)["windows"]
    assert w["straggler"] == {"base": None, "new": 2, "changed": True}
    assert w["verdict"] == "slower"
    assert w["ranks"][0]["change_us"] > 0
    # the others wait for rank 2: the change is mostly exposed communication
    assert w["parts"]["exposed_comm_us"] > w["parts"]["compute_us"] > 0


@pytest.mark.parametrize(("base_shape", "new_shape", "what"), [
    ({}, {"world": 8}, "world"),
    ({}, {"gpu": False}, "basis"),
])
def test_runs_that_differ_get_no_verdict(tmp_path: Path, base_shape: dict[str, Any],
                                         new_shape: dict[str, Any], what: str) -> None:
    base = _run(tmp_path / "base", **base_shape)
    new = _run(tmp_path / "new", **new_shape)
    (w,) = _compare(base, new)["windows"]
    assert not w["comparable"] and w["verdict"] is None
    assert [d["what"] for d in w["differences"] if d["blocks"]] == [what]
    assert w["why"].startswith("not compared: ")
    text = run_cli("compare", base, new, cwd=tmp_path, timeout=120)
    assert text.returncode == 0 and "differs: " in text.stdout and "verdict: none" in text.stdout


def test_windows_pair_in_order_or_by_the_steps_named(tmp_path: Path) -> None:
    base = str(tmp_path / "base")
    make_run(base, 4, windows=2, **SHAPE)
    new = str(tmp_path / "new")
    make_run(new, 4, windows=3, **{**SHAPE, "compute_us": 8000.0})
    result = _compare(base, new)
    assert [(w["base"]["steps"], w["new"]["steps"]) for w in result["windows"]] \
        == [([1], [1]), ([2], [2])]
    assert result["unmatched"] == {"base": [], "new": ["trainer, step 3, cycle 0"]}
    # each run's windows are alike: no drift between them, and the change stands
    assert [(w["test"]["drift"], w["verdict"]) for w in result["windows"]] \
        == [(0.0, "slower"), (0.0, "slower")]
    (w,) = _compare(base, new, steps=(2, 3))["windows"]
    assert (w["base"]["steps"], w["new"]["steps"]) == ([2], [3])
    with pytest.raises(AnalysisError, match=r"^NEW: no capture window covers step 9"):
        compare_runs(base, new, steps=(1, 9))
    done = run_cli("compare", base, new, "--step", "1:x", cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and "expected N or A:B" in done.stderr


def _said(word: str | None, why: str = "median step time +40.0% (p = 0.0006 < 0.005)",
          region: str | None = None) -> dict[str, Any]:
    return {"role": "actor", "region": region, "verdict": word, "why": why,
            "test": {"agree": None}}


def test_a_change_in_one_window_alone_is_the_machines() -> None:
    """A machine busy for a few seconds slows the window it overlaps; a code change shows
    in every window that runs the code."""
    lone = [_said("slower"), _said("no change", "within noise (p = 0.4 >= 0.005)")]
    agree(lone)
    assert [w["verdict"] for w in lone] == ["no change", "no change"]
    assert [w["test"]["agree"] for w in lone] == [False, False]
    assert lone[0]["why"] == (
        "within noise (this window alone is median step time +40.0% (p = 0.0006 < 0.005); "
        "other windows of actor say no change: a change in some windows only is the "
        "machine's)")
    both = [_said("slower"), _said("slower"), _said(None, "too few steps")]
    agree(both)
    assert [w["verdict"] for w in both] == ["slower", "slower", None]
    assert [w["test"]["agree"] for w in both] == [True, True, None]
    torn = [_said("slower", region="gen"), _said("faster", region="gen")]
    agree(torn)
    assert [w["verdict"] for w in torn] == ["no change", "no change"]
    assert "other windows of actor/gen say faster" in torn[0]["why"]
    one = [_said("faster")]
    agree(one)
    assert (one[0]["verdict"], one[0]["test"]["agree"]) == ("faster", True)


def test_runs_kept_as_summaries_only_are_compared(tmp_path: Path) -> None:
    base, new = tmp_path / "base", tmp_path / "new"
    make_summarised_run(str(base), 64, steps=10, ops=20, gpu=True, extra_us=0.0)
    make_summarised_run(str(new), 64, slow=5, steps=10, ops=20, gpu=True, extra_us=4000.0)
    assert not list(base.rglob("*.pt.trace.json*"))
    (w,) = _compare(str(base), str(new))["windows"]
    assert w["straggler"]["new"] == 5 and w["verdict"] == "slower"


def test_nothing_to_pair_is_an_error_naming_the_runs(tmp_path: Path) -> None:
    base = _run(tmp_path / "base")
    other = str(tmp_path / "other")
    make_run(other, 4, role="critic", **SHAPE)
    with pytest.raises(AnalysisError, match=r"no window of BASE matches one of NEW"):
        compare_runs(base, other)
    done = run_cli("compare", base, str(tmp_path / "nowhere"), cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and "NEW: " in done.stderr and "is not a folder" in done.stderr


def test_the_report_compares_with_a_baseline(tmp_path: Path) -> None:
    base = _run(tmp_path / "base")
    new = _run(tmp_path / "new", compute_us=8000.0)
    page = tmp_path / "r.html"
    done = run_cli("report", new, "-o", str(page), "--baseline", base, cwd=tmp_path,
                   timeout=120)
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    assert "<h2>Against the baseline</h2>" in text and '<span class="slower">slower</span>' in text
    assert "<script" not in text
    assert text.index("Against the baseline") < text.index("<h2>Analysis</h2>")
    missing = run_cli("report", new, "-o", str(tmp_path / "m.html"), "--baseline",
                      str(tmp_path / "none"), cwd=tmp_path, timeout=120)
    assert missing.returncode == 0 and "BASE: " in (tmp_path / "m.html").read_text()


def test_from_a_median_step_of_zero_a_change_is_said_in_milliseconds(tmp_path: Path) -> None:
    """A share of nothing has no percentage: a base whose steps all take 0 ms against one
    whose steps take 5 ms is slower, said in milliseconds, never "no change (+0.0%)"."""
    import gzip

    base = _run(tmp_path / "base", gpu=False)
    for trace in Path(base).rglob("*.pt.trace.json.gz"):
        doc = json.loads(gzip.decompress(trace.read_bytes()))
        for event in doc["traceEvents"]:
            if str(event.get("name")).startswith("ProfilerStep#"):
                event["dur"] = 0.0
        trace.write_bytes(gzip.compress(json.dumps(doc).encode()))
    new = _run(tmp_path / "new", gpu=False)
    (w,) = _compare(base, new)["windows"]
    assert w["step_time"]["base_median_us"] == 0 and w["step_time"]["new_median_us"] > 5000
    assert w["verdict"] == "slower"
    assert w["why"].startswith("median step time 0.000 -> 5.3 ms (from a median step of 0: "
                               "no percentage) (p = ")
    text = run_cli("compare", base, new, cwd=tmp_path, timeout=120).stdout
    assert "verdict: slower" in text and "%" not in text.split("verdict:")[1].split("\n")[1]
    assert verdict([0.0] * 9, [0.0] * 9)["verdict"] == "no change"


def test_region_rows_are_over_the_whole_capture_and_say_so(tmp_path: Path) -> None:
    """A summary holds each region's time over the capture, not per step: a region whose
    first step alone took 45 ms longer moves its row by 4.5 ms per step over 10 steps,
    while the step times, from which the first step is left out, show no change."""
    import gzip

    base = _run(tmp_path / "base", gpu=False)
    new = _run(tmp_path / "new", gpu=False)
    for trace in Path(new).rglob("*.pt.trace.json.gz"):
        doc = json.loads(gzip.decompress(trace.read_bytes()))
        first = next(e for e in doc["traceEvents"] if e.get("name") == "update_actor")
        first["dur"] += 45_000.0
        trace.write_bytes(gzip.compress(json.dumps(doc).encode()))
    (w,) = _compare(base, new)["windows"]
    assert w["verdict"] == "no change" and w["step_time"]["change_us"] == 0
    (row,) = [r for r in w["regions"] if r["name"] == "update_actor"]
    assert row["change_us"] == pytest.approx(4500.0)
    text = run_cli("compare", base, new, cwd=tmp_path, timeout=120).stdout
    assert "  regions that moved most (ms per step, over the whole capture: its first step " \
           "included):\n    update_actor: " in text
    page = tmp_path / "r.html"
    run_cli("report", new, "-o", str(page), "--baseline", base, cwd=tmp_path, timeout=120)
    assert "<th>region (ms per step, over the whole capture: its first step included)</th>" \
        in page.read_text()
