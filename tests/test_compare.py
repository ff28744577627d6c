"""policy-engine compare on generated runs: the verdict and its noise gate, the change split
into parts that sum to it, regions and operators matched by name, the straggler then and
now, differences that withhold a verdict, steps paired by hand, runs kept as summaries
only, and the JSON's shape against schemas/compare.schema.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import jsonschema
import pytest
from analysis_traces import make_run, make_summarised_run
from job_env import run_cli

from policy_engine.analysis import AnalysisError
from policy_engine.analysis.compare import compare_runs
from policy_engine.analysis.compare_gate import verdict
from policy_engine.analysis.comparison import Difference, RunComparison, Then

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "schemas" / "compare.schema.json").read_text())
SHAPE = {"steps": 10, "ops": 30, "gpu": True}


def _run(path: Path, world: int = 4, **shape: Any) -> str:
    make_run(str(path), world, **{**SHAPE, **shape})
    return str(path)


def _compare(base: str, new: str, **kw: Any) -> RunComparison:
    result = compare_runs(base, new, **kw)
    jsonschema.validate(result.to_json(), SCHEMA)
    return result


def test_more_compute_is_slower_and_the_change_is_compute(tmp_path: Path) -> None:
    base = _run(tmp_path / "base")
    new = _run(tmp_path / "new", compute_us=8000.0)
    result = _compare(base, new)
    (w,) = result.windows
    assert w.comparable and w.differences == ()
    assert w.verdict == "slower" and w.test.p < 0.005
    # the sample is the step (4 ranks' n-th step counted once), less the capture's first
    assert (w.test.base_steps, w.test.new_steps) == (9, 9)
    parts, change = w.parts, w.step_time.change_us
    assert sum(parts.values()) == pytest.approx(change, abs=0.01)
    assert parts["compute_us"] == pytest.approx(change, rel=0.05)  # all of it is compute
    assert w.regions[0].name == "update_actor" and w.regions[0].change_us > 0
    grown = [o for o in w.operators if o.change_us > 0]
    assert grown[0].cat == "kernel" and "gemm" in grown[0].name
    assert "aten::linear" in [o.name for o in grown]
    assert w.straggler == Then(None, None, False)
    back = _compare(new, base).windows[0]
    assert back.verdict == "faster" and back.parts["compute_us"] < 0


def test_the_same_run_twice_is_no_change(tmp_path: Path) -> None:
    base, new = _run(tmp_path / "a"), _run(tmp_path / "b")
    (w,) = _compare(base, new).windows
    assert w.verdict == "no change" and w.step_time.change_us == 0
    assert all(v == 0 for v in w.parts.values())


def test_a_slow_rank_added_is_the_straggler_change(tmp_path: Path) -> None:
    base = _run(tmp_path / "base")
    new = _run(tmp_path / "new", slow=2, extra_us=3000.0)
    (w,) = _compare(base, new).windows
    assert w.straggler == Then(None, 2, True)
    assert w.verdict == "slower"
    assert w.ranks[0].change_us > 0
    # the others wait for rank 2: the change is mostly exposed communication
    assert w.parts["exposed_comm_us"] > w.parts["compute_us"] > 0


@pytest.mark.parametrize(("base_shape", "new_shape", "what"), [
    ({}, {"world": 8}, "world"),
    ({}, {"gpu": False}, "basis"),
])
def test_runs_that_differ_get_no_verdict(tmp_path: Path, base_shape: dict[str, Any],
                                         new_shape: dict[str, Any], what: str) -> None:
    base = _run(tmp_path / "base", **base_shape)
    new = _run(tmp_path / "new", **new_shape)
    (w,) = _compare(base, new).windows
    assert not w.comparable and w.verdict is None
    assert [d.what for d in w.differences if d.blocks] == [what]
    assert w.why.startswith("not compared: ")
    text = run_cli("compare", base, new, cwd=tmp_path, timeout=120)
    assert text.returncode == 0 and "differs: " in text.stdout and "verdict: none" in text.stdout


def test_windows_pair_in_order_or_by_the_steps_named(tmp_path: Path) -> None:
    base = str(tmp_path / "base")
    make_run(base, 4, windows=2, **SHAPE)
    new = str(tmp_path / "new")
    make_run(new, 4, windows=3, **{**SHAPE, "compute_us": 8000.0})
    result = _compare(base, new)
    assert [(w.base.steps, w.new.steps) for w in result.windows] \
        == [((1,), (1,)), ((2,), (2,))]
    assert result.unmatched == {"base": (), "new": ("trainer, step 3, cycle 0",)}
    # each run's windows are alike: no drift between them, and the change stands
    assert [(w.test.drift, w.verdict) for w in result.windows] \
        == [(0.0, "slower"), (0.0, "slower")]
    (w,) = _compare(base, new, steps=(2, 3)).windows
    assert (w.base.steps, w.new.steps) == ((2,), (3,))
    with pytest.raises(AnalysisError, match=r"^NEW: no capture window covers step 9"):
        compare_runs(base, new, steps=(1, 9))
    done = run_cli("compare", base, new, "--step", "1:x", cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and "expected N or A:B" in done.stderr


def test_runs_kept_as_summaries_only_are_compared(tmp_path: Path) -> None:
    base, new = tmp_path / "base", tmp_path / "new"
    make_summarised_run(str(base), 64, steps=10, ops=20, gpu=True, extra_us=0.0)
    make_summarised_run(str(new), 64, slow=5, steps=10, ops=20, gpu=True, extra_us=4000.0)
    assert not list(base.rglob("*.pt.trace.json*"))
    (w,) = _compare(str(base), str(new)).windows
    assert w.straggler.new == 5 and w.verdict == "slower"


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
    (w,) = _compare(base, new).windows
    assert w.step_time.base_median_us == 0 and w.step_time.new_median_us > 5000
    assert w.verdict == "slower"
    assert w.why.startswith("median step time 0.000 -> 5.3 ms (from a median step of 0: "
                               "no percentage) (p = ")
    text = run_cli("compare", base, new, cwd=tmp_path, timeout=120).stdout
    assert "verdict: slower" in text and "%" not in text.split("verdict:")[1].split("\n")[1]
    assert verdict([0.0] * 9, [0.0] * 9).verdict == "no change"


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
    (w,) = _compare(base, new).windows
    assert w.verdict == "no change" and w.step_time.change_us == 0
    (row,) = [r for r in w.regions if r.name == "update_actor"]
    assert row.change_us == pytest.approx(4500.0)
    text = run_cli("compare", base, new, cwd=tmp_path, timeout=120).stdout
    assert "  regions that moved most (ms per step, over the whole capture: its first step " \
           "included):\n    update_actor: " in text
    page = tmp_path / "r.html"
    run_cli("report", new, "-o", str(page), "--baseline", base, cwd=tmp_path, timeout=120)
    assert "<th>region (ms per step, over the whole capture: its first step included)</th>" \
        in page.read_text()


def test_one_policy_run_into_two_folders_is_one_policy(tmp_path: Path) -> None:
    """The manifests carry the policy's digest less output_dir beside the whole one: the
    same policy run into two folders (``--set output_dir=...``, the demo's ``--out``) has
    one, another setting changes it."""
    from policy_engine.language.load import load_policy
    from policy_engine.plan.compile import compile_plan
    from policy_engine.plan.topology import Topology

    doc = {"version": 1, "roles": {"trainer": {"enabled": True, "steps": [2]}}}
    here = load_policy({**doc, "output_dir": str(tmp_path / "a")})
    there = load_policy(doc, overrides=[f"output_dir={tmp_path / 'b'}"])
    other = load_policy({**doc, "output_dir": str(tmp_path / "a"), "prefix": "other"})
    assert here.policy_hash != there.policy_hash
    assert here.policy_content_hash == there.policy_content_hash != other.policy_content_hash
    identity = compile_plan(there, "trainer", Topology()).identity(None)
    assert identity["policy_content_hash"] == here.policy_content_hash
    assert identity["policy_hash"] == there.policy_hash


def _stamp(run: str, **fields: str) -> None:
    """Every manifest line of ``run`` that names a rank given ``fields``, as the runtime
    writes them (a manifest written before a field existed lacks it)."""
    from policy_engine.runtime.process.manifest import encode

    for manifest in Path(run, "manifests").iterdir():
        lines = [json.loads(line) for line in manifest.read_bytes().splitlines()]
        manifest.write_bytes(b"".join(encode({**line, **fields} if "rank" in line else line)
                                      for line in lines))


def test_compare_tells_policies_apart_by_their_digest_less_output_dir(tmp_path: Path) -> None:
    base, new = _run(tmp_path / "base"), _run(tmp_path / "new")
    _stamp(base, policy_hash="a1", policy_content_hash="c1")
    _stamp(new, policy_hash="b2", policy_content_hash="c1")
    (w,) = _compare(base, new).windows
    assert w.differences == () and w.verdict == "no change"
    _stamp(new, policy_hash="b2", policy_content_hash="c2")
    (w,) = _compare(base, new).windows
    assert w.differences == (Difference("policy", ["c1"], ["c2"], False,
                                        "policy differs (compared all the same)"),)
    # a run recorded before the digest less output_dir: the whole digests, and it says why
    old = _run(tmp_path / "old")
    _stamp(old, policy_hash="a0")
    (w,) = _compare(old, new).windows
    assert w.differences == (Difference(
        "policy", ["a0"], ["b2"], False,
        "policy differs (compared all the same; the base run's manifests hold only the "
        "policy's whole digest, output_dir included: runs into two folders differ by it "
        "alone)"),)


def test_an_inconclusive_window_shows_what_would_decide(tmp_path: Path) -> None:
    """The text and the report show an inconclusive verdict with the change, p, the steps
    used and about how many steps a side would decide."""
    from test_compare_gate import _steps

    from policy_engine.analysis.compare_page import window_html
    from policy_engine.analysis.compare_text import render

    result = _compare(_run(tmp_path / "base"), _run(tmp_path / "new"))
    said = verdict(_steps(7, 30.0, 0.08), _steps(7, 34.5, 0.08))
    (w,) = result.windows
    w = attrs.evolve(w, verdict=said.verdict, why=said.why, test=said.test)
    result = attrs.evolve(result, windows=(w,))
    jsonschema.validate(result.to_json(), SCHEMA)
    t = w.test
    assert w.verdict == "inconclusive" and t is not None and t.decide_steps is not None
    html = window_html(w)
    assert '<span class="inconclusive">inconclusive</span>' in html
    assert (f"<p>Median step +15.0%, p = {t.p:.2g} (alpha 0.005), 7 and 7 steps, least "
            f"change these steps could call: {t.detectable:.1%}, about {t.decide_steps} "
            "steps a side would decide.</p>") in html
    text = render(result)
    assert f"  verdict: inconclusive - median step time +15.0% (p = {t.p:.2g}, 7 and 7 " \
           "steps; " in text
    assert f"about {t.decide_steps} steps a side would decide)\n" in text
