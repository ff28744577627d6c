"""The step timeline (analysis/timeline.py) on generated RL-shaped runs, read from the
manifests' summaries alone: phases on one clock, the measured offsets applied, who waits
for whom, the critical path, rows of agreeing ranks, missing roles, bounds; the
`policy-engine timeline` command and `analyze --format json`'s part, against the schema."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from timeline_runs import make_rl_run, phase, rl_step

from policy_engine.analysis import timeline as timeline_mod
from policy_engine.analysis.run import analyze, analyze_run
from policy_engine.cli.main import main

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "schemas" /
                     "analysis.schema.json").read_text())
GEN, REF, UPD = 600.0, 120.0, 250.0


def timeline(root: Path, **options: Any) -> dict[str, Any]:
    result = analyze_run(str(root), **options)
    result.close()
    assert result.timeline is not None
    return dict(result.timeline)


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["timeline", *args])
    return code, out.getvalue(), err.getvalue()


def row(step: dict[str, Any], role: str, ranks: str) -> dict[str, Any]:
    (found,) = [r for r in step["rows"] if r["role"] == role and r["ranks"] == ranks]
    return found


@pytest.fixture(scope="module")
def skewed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Steps 3 and 4 of the verl-shaped job; rank 3's host clock is 2 s ahead, and every
    rank measured its offset."""
    root = tmp_path_factory.mktemp("skewed")
    make_rl_run(str(root), 4, {3: rl_step(), 4: rl_step()}, skew={3: 2000.0})
    return root


def test_the_ranks_lie_on_one_clock_when_their_offsets_are_applied(skewed: Path) -> None:
    found = timeline(skewed)
    assert found["clock"]["basis"] == "measured" and found["clock"]["reference"] == 0
    assert [s["step"] for s in found["steps"]] == [3, 4]
    step = found["steps"][0]
    # ranks 2 and 3 agree once rank 3's clock is brought back: one row
    assert [(r["role"], r["ranks"]) for r in step["rows"]] == [("actor+ref", "0-1"),
                                                               ("rollout", "2-3")]
    rollout = row(step, "rollout", "2-3")
    assert [p["name"] for p in rollout["phases"]] == ["generate_sequences", "sync_weights"]
    assert rollout["phases"][0]["start_us"] == pytest.approx(0.0, abs=1)
    assert step["span_us"] == pytest.approx((GEN + 10 + REF + UPD + 20) * 1000, rel=1e-6)
    assert step["uncertainty_us"] == pytest.approx(150.0)


def test_without_the_offsets_the_skewed_rank_is_two_seconds_off(skewed: Path) -> None:
    found = timeline(skewed, own_clocks=True)
    assert found["clock"]["basis"] == "own"
    step = found["steps"][0]
    assert [(r["role"], r["ranks"]) for r in step["rows"]] == [
        ("actor+ref", "0-1"), ("rollout", "2"), ("rollout", "3")]
    starts = {r["ranks"]: r["phases"][0]["start_us"] for r in step["rows"]}
    assert starts["3"] - starts["2"] == pytest.approx(2_000_000.0, abs=1)


def test_the_actor_waits_for_generate_and_the_rollout_for_the_update(skewed: Path) -> None:
    step = timeline(skewed)["steps"][0]
    first = step["waits"][0]
    assert (first["role"], first["ranks"], first["for_role"], first["for_ranks"],
            first["phase"]) == ("actor+ref", "0-1", "rollout", "2-3", "generate_sequences")
    assert first["wait_us"] == pytest.approx(GEN * 1000, rel=0.01)
    assert first["text"].startswith("ranks 0-1 (actor+ref) wait 60% of step 3 (600.0 ms) "
                                    "while ranks 2-3 (rollout) run generate_sequences")
    # the rollout waits in sync_weights through the ref's log-probs and the update: one
    # wait, given to the phase that covers most of it
    (back,) = [w for w in step["waits"] if w["role"] == "rollout"]
    assert (back["for_role"], back["phase"]) == ("actor+ref", "actor_update")
    assert back["wait_us"] == pytest.approx((REF + UPD) * 1000, rel=0.03)
    actor = row(step, "actor+ref", "0-1")
    # busy, waiting and idle fill what the row recorded
    assert actor["busy_us"] + actor["wait_us"] + actor["idle_us"] == pytest.approx(
        actor["span"][1] - actor["span"][0], abs=1)
    assert [w["phase"] for w in actor["waiting"]] == ["generate_sequences"]


def test_the_critical_path_runs_from_generate_to_the_update_and_the_sync(skewed: Path) -> None:
    step = timeline(skewed)["steps"][0]
    assert [(p["role"], p["phase"]) for p in step["critical_path"]] == [
        ("rollout", "generate_sequences"), ("actor+ref", "ref_compute_log_prob"),
        ("actor+ref", "actor_update"), ("rollout", "sync_weights")]


def test_without_measurements_the_offsets_are_zero_and_the_output_says_so(
        tmp_path: Path) -> None:
    make_rl_run(str(tmp_path), 4, {3: rl_step()}, measured=[])
    found = timeline(tmp_path)
    assert found["clock"]["basis"] == "none"
    assert "no rank measured its clock" in found["clock"]["text"]
    code, out, _ = cli(str(tmp_path))
    assert code == 0 and out.startswith("clock: no rank measured its clock (no job channel")


def test_a_rank_without_a_measurement_is_named(tmp_path: Path) -> None:
    make_rl_run(str(tmp_path), 4, {3: rl_step()}, measured=[0, 1, 2])
    clock = timeline(tmp_path)["clock"]
    assert clock["basis"] == "partial" and clock["unmeasured"] == "3"
    assert "ranks 3 measured none" in clock["text"]


def test_a_step_without_a_roles_capture_is_named_not_guessed(tmp_path: Path) -> None:
    partial = {r: v for r, v in rl_step().items() if r < 2}  # no rollout capture in step 4
    make_rl_run(str(tmp_path), 4, {3: rl_step(), 4: partial})
    steps = timeline(tmp_path)["steps"]
    assert [s["missing"] for s in steps] == [[], ["rollout"]]
    code, out, _ = cli(str(tmp_path), "--step", "4")
    assert code == 0 and "no capture of rollout in this step" not in out  # only step 4
    code, out, _ = cli(str(tmp_path))
    assert "  no capture of rollout in this step" in out


def test_colocated_phases_in_sequence_with_their_shares(tmp_path: Path) -> None:
    hybrid = {r: ("actor+rollout+ref", [phase("generate_sequences", 0, 400),
                                        phase("actor_compute_log_prob", 400, 500),
                                        phase("ref_compute_log_prob", 500, 600),
                                        phase("actor_update", 600, 800, tail=20)],
                  (0.0, 800.0)) for r in (0, 1)}
    make_rl_run(str(tmp_path), 2, {3: hybrid})
    (step,) = timeline(tmp_path)["steps"]
    (only,) = step["rows"]
    assert only["colocated"] and only["ranks"] == "0-1"
    assert [(p["name"], p["share"]) for p in only["phases"]] == [
        ("generate_sequences", 0.5), ("actor_compute_log_prob", 0.125),
        ("ref_compute_log_prob", 0.125), ("actor_update", 0.25)]
    assert only["wait_us"] == 0 and only["busy_us"] == pytest.approx(800_000, abs=1)
    assert [p["phase"] for p in step["critical_path"]] == [
        "generate_sequences", "actor_compute_log_prob", "ref_compute_log_prob",
        "actor_update"]


def test_ranks_whose_phases_differ_get_rows_of_their_own(tmp_path: Path) -> None:
    make_rl_run(str(tmp_path), 4, {3: rl_step(late={1: 80.0})})
    step = timeline(tmp_path)["steps"][0]
    assert [(r["role"], r["ranks"]) for r in step["rows"]] == [
        ("actor+ref", "0"), ("actor+ref", "1"), ("rollout", "2-3")]


def test_rows_per_role_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline_mod, "MAX_ROWS", 2)
    ranks = {r: ("trainer", [phase("update", 10.0 * r, 10.0 * r + 5)], (0.0, 200.0))
             for r in range(6)}
    make_rl_run(str(tmp_path), 6, {1: ranks})
    (step,) = timeline(tmp_path)["steps"]
    # no two ranks agree: past two rows, each rank joins the row nearest its own
    assert len(step["rows"]) == 2 and sum(r["rank_count"] for r in step["rows"]) == 6


def test_a_trace_without_the_runtimes_list_takes_every_annotation(tmp_path: Path) -> None:
    make_rl_run(str(tmp_path), 4, {3: rl_step()}, marked=False)
    step = timeline(tmp_path)["steps"][0]
    assert [p["name"] for p in row(step, "rollout", "2-3")["phases"]] == [
        "generate_sequences", "sync_weights"]  # ProfilerStep#0 is no phase


def test_analyze_json_holds_the_timeline_and_meets_the_schema(skewed: Path) -> None:
    document = analyze(str(skewed))
    jsonschema.validate(document, SCHEMA)
    assert document["version"] == 2
    assert document["timeline"] == timeline(skewed)
    code, out, _ = cli(str(skewed), "--format", "json")
    assert code == 0 and json.loads(out) == document["timeline"]


def test_the_command_prints_each_step(skewed: Path) -> None:
    code, out, _ = cli(str(skewed), "--step", "3")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == ("clock: times on rank 0's clock, each rank's measured offset applied "
                        "(uncertainty up to 0.150 ms)")
    assert lines[2] == "step 3: 1000.0 ms (clock uncertainty up to 0.150 ms)"
    assert "  rollout ranks 2-3: generate_sequences 0.0-600.0 ms (60%), sync_weights " \
           "602.0-995.0 ms (39%)" in lines
    assert ("  critical path: generate_sequences (rollout 2-3) -> ref_compute_log_prob "
            "(actor+ref 0-1) -> actor_update (actor+ref 0-1) -> sync_weights (rollout 2-3)"
            ) in lines


def test_names_from_the_manifests_are_printed_escaped(tmp_path: Path) -> None:
    ranks = {0: ("trainer", [phase("evil\x1b[31m\nname", 0, 5)], (0.0, 10.0))}
    make_rl_run(str(tmp_path), 1, {1: ranks})
    code, out, _ = cli(str(tmp_path))
    assert code == 0 and "\x1b" not in out and "evil\\x1b[31m\\nname 0.0-5.0 ms" in out


def test_merge_moves_each_rank_by_its_measured_offset(tmp_path: Path) -> None:
    make_rl_run(str(tmp_path / "run"), 4, {3: rl_step()}, skew={3: 2000.0}, keep_traces=True)

    def starts(*extra: str) -> dict[int, float]:
        out = tmp_path / f"merged{len(extra)}.json"
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()) as err:
            assert main(["merge", str(tmp_path / "run"), "--role", "rollout", "-o", str(out),
                         *extra]) == 0
        doc = json.loads(out.read_text())
        assert doc["policy_engine_merge"]["clock"] in err.getvalue()
        return {e["pid"] - 1: e["ts"] for e in doc["traceEvents"]
                if e.get("name") == "generate_sequences"}

    aligned, own = starts(), starts("--own-clocks")
    assert aligned[3] - aligned[2] == pytest.approx(0.0, abs=1)
    assert own[3] - own[2] == pytest.approx(2_000_000.0, abs=1)


def test_the_critical_path_holds_through_a_row_of_ranks_that_differ_a_little(
        tmp_path: Path) -> None:
    # rank 3 ends generate 15 ms after rank 2, within what makes them one row: the row's
    # generate ends after the ref's log-probs begin, and still comes before them
    make_rl_run(str(tmp_path), 4, {3: rl_step(late={3: 15.0})})
    step = timeline(tmp_path)["steps"][0]
    assert row(step, "rollout", "2-3")["phases"][0]["end_us"] > \
        row(step, "actor+ref", "0-1")["phases"][0]["start_us"]
    assert [p["phase"] for p in step["critical_path"]][:2] == ["generate_sequences",
                                                              "ref_compute_log_prob"]


def test_the_library_gives_the_same_timeline(skewed: Path) -> None:
    from policy_engine.analysis import step_timeline as library

    assert library(str(skewed), step=4) == timeline(skewed, step=4)
    own = library(str(skewed), own_clocks=True)
    assert own["clock"]["basis"] == "own" and len(own["steps"]) == 2
