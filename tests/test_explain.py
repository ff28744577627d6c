"""``policy-engine explain``: what a role does on every rank, as JSON and as text."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from policy_engine import load_policy
from policy_engine.cli.main import main
from policy_engine.plan.captures import opened
from policy_engine.plan.compile import compile_plan
from policy_engine.plan.predict import explain
from policy_engine.plan.topology import Topology

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ROOT / "policies"
MEGATRON = str(POLICIES / "megatron_3d.yaml")
PLACEHOLDERS = "_pid<pid>_<timestamp>"


def explain_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["explain", *argv, "--format", "json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def profiled(data: dict[str, Any]) -> list[int]:
    return [entry["rank"] for entry in data["ranks"] if entry["profiled"]]


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------- the JSON shape


def test_coordinate_selectors_on_a_3d_mesh(capsys: pytest.CaptureFixture[str]) -> None:
    """megatron_3d: {tp: 0, dp: [0, -1]} on pp=2,dp=2,tp=2 selects ranks 0, 2, 4 and 6."""
    data = explain_json(capsys, MEGATRON, "--role", "trainer")
    assert (data["role"], data["world"]) == ("trainer", 8)
    assert [entry["rank"] for entry in data["ranks"]] == list(range(8))
    assert profiled(data) == [0, 2, 4, 6]
    first = data["ranks"][0]
    assert first == {
        "rank": 0, "profiled": True, "coords": {"tp": 0, "pp": 0, "dp": 0},
        "local_rank": 0, "node": 0, "backend": "torch", "backends": ["torch"],
        "steps": [10, 11, 12], "inner_steps": 10,  # prof.step() calls a step, assumed
        "actions": ["NONE", "WARMUP", "RECORD", "RECORD", "RECORD_AND_SAVE",
                    "NONE", "NONE", "NONE", "NONE", "NONE"],
        "name": "trainer/step10-12/cycle0/gpt-8b_rank0-of-8_tp0pp0dp0" + PLACEHOLDERS,
        "captures": [{"steps": [10, 11, 12], "region": None,
                      "name": "trainer/step10-12/cycle0/gpt-8b_rank0-of-8_tp0pp0dp0"
                      + PLACEHOLDERS}],
        # Every trace, as the run names it: one recorded cycle of the merged capture, and
        # its file with the backend's ending.
        "traces": [{"steps": [10, 11, 12], "region": None, "cycle": 0,
                    "name": "trainer/step10-12/cycle0/gpt-8b_rank0-of-8_tp0pp0dp0" + PLACEHOLDERS,
                    "files": [{"backend": "torch", "path": "trainer/step10-12/cycle0/gpt-8b_"
                               "rank0-of-8_tp0pp0dp0" + PLACEHOLDERS + ".pt.trace.json.gz"}]}],
    }
    # Rank 5 is pp1 dp0 tp1 (the last dimension varies fastest) and is not profiled.
    assert data["ranks"][5] == {"rank": 5, "profiled": False,
                                "coords": {"tp": 1, "pp": 1, "dp": 0},
                                "local_rank": 5, "node": 0}
    assert [entry["coords"] for entry in data["ranks"] if entry["profiled"]] == [
        {"tp": 0, "pp": 0, "dp": 0}, {"tp": 0, "pp": 0, "dp": 1},
        {"tp": 0, "pp": 1, "dp": 0}, {"tp": 0, "pp": 1, "dp": 1}]
    assert data["ranks"][6]["name"] == (
        "trainer/step10-12/cycle0/gpt-8b_rank6-of-8_tp0pp1dp1" + PLACEHOLDERS)


def test_every_rank_has_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    data = explain_json(capsys, str(POLICIES / "verl_ppo.yaml"), "--role", "actor",
                        "--world", "4")
    assert set(data) == {"role", "world", "ranks"}
    for entry in data["ranks"]:
        assert {"rank", "profiled", "coords"} <= set(entry)
        if entry["profiled"]:
            assert {"backend", "steps", "actions", "name"} <= set(entry)
    assert profiled(data) == [0, 3]  # ranks: [0, -1]


def test_mesh_option_and_local_world(capsys: pytest.CaptureFixture[str]) -> None:
    data = explain_json(capsys, MEGATRON, "--role", "trainer", "--mesh", "dp=4,tp=2",
                        "--local-world", "4")
    assert data["world"] == 8
    assert profiled(data) == [0, 6]  # tp 0 of dp groups 0 and 3
    assert [(e["node"], e["local_rank"]) for e in data["ranks"]][5:7] == [(1, 1), (1, 2)]


# ---------------------------------------------------------------- overrides


def test_set_overrides_apply_to_explain(capsys: pytest.CaptureFixture[str]) -> None:
    data = explain_json(capsys, MEGATRON, "--role", "trainer", "--set", "roles.trainer.ranks=all")
    assert profiled(data) == list(range(8))
    data = explain_json(capsys, MEGATRON, "--role", "trainer",
                        "--set", "roles.trainer.ranks={pp: -1, tp: 1}",
                        "--set", "defaults.backend=nsys")
    assert profiled(data) == [5, 7]
    assert {e["backend"] for e in data["ranks"] if e["profiled"]} == {"nsight"}


def test_bad_override_in_explain_is_reported_as_the_override(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", MEGATRON, "--role", "trainer",
                 "--set", "roles.trainer.ranks=bogus"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == ("--set roles.trainer.ranks=bogus: error: malformed rank range 'bogus' "
                   "(expected N, -N or A-B with A, B >= 0) (at $.roles.trainer.ranks)\n")


def test_environment_overrides_apply_to_explain(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROFILE_POLICY_SET", "roles.trainer.ranks=-1")
    assert profiled(explain_json(capsys, MEGATRON, "--role", "trainer")) == [7]


# ---------------------------------------------------------------- captures and names


def test_merge_steps_labels_one_capture_per_run(capsys: pytest.CaptureFixture[str]) -> None:
    data = explain_json(capsys, MEGATRON, "--role", "trainer",
                        "--set", "roles.trainer.steps=[10, 12, 13, 14]")
    first = data["ranks"][0]
    assert first["steps"] == [10, 12, 13, 14]
    assert [(c["steps"], c["name"]) for c in first["captures"]] == [
        ([10], "trainer/step10/cycle0/gpt-8b_rank0-of-8_tp0pp0dp0" + PLACEHOLDERS),
        ([12, 13, 14], "trainer/step12-14/cycle0/gpt-8b_rank0-of-8_tp0pp0dp0" + PLACEHOLDERS),
    ]


def test_without_merge_each_step_is_a_capture(capsys: pytest.CaptureFixture[str]) -> None:
    data = explain_json(capsys, MEGATRON, "--role", "trainer",
                        "--set", "roles.trainer.merge_steps=false", "--steps", "11-30")
    names = [c["name"] for c in data["ranks"][2]["captures"]]
    assert names == [f"trainer/step{n}/cycle0/gpt-8b_rank2-of-8_tp0pp0dp1" + PLACEHOLDERS
                     for n in (11, 12)]


def test_periodic_steps_in_a_window(capsys: pytest.CaptureFixture[str],
                                    tmp_path: Path) -> None:
    path = write(tmp_path, "version: 1\nroles:\n  r:\n    enabled: true\n"
                           "    steps: {every: 100, from: 100}\n    name: r_step<step>\n")
    data = explain_json(capsys, path, "--role", "r", "--world", "1", "--steps", "150-450")
    entry = data["ranks"][0]
    assert entry["steps"] == [200, 300, 400]
    assert [t["name"] for t in entry["traces"]] == ["r_step200", "r_step300", "r_step400"]
    # a window far out costs what a near one costs: nothing expands the set
    far = explain_json(capsys, path, "--role", "r", "--world", "1",
                       "--steps", "100000000000000-100000000000100")
    assert far["ranks"][0]["steps"] == [10**14, 10**14 + 100]
    assert main(["explain", path, "--role", "r", "--world", "1", "--steps", "0-99"]) == 0
    assert "rank 0: profiled with torch, steps none in range" in capsys.readouterr().out


def test_torchtitan_names_each_cycle_by_its_step(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(POLICIES / "torchtitan.yaml")
    data = explain_json(capsys, path, "--role", "trainer", "--world", "2",
                        "--steps", "1-400", "--inner-steps", "1")
    entry = data["ranks"][1]
    assert [c["steps"][0] for c in entry["captures"]] == [1]  # one capture for the run
    assert [(t["name"], t["cycle"]) for t in entry["traces"]] == [
        (f"iteration_{n}/rank1_trace", cycle) for cycle, n in enumerate((100, 200, 300, 400))]
    assert entry["name"] == "iteration_100/rank1_trace"
    # one prof.step() a training step is what explain assumes for such a plan untold
    untold = explain_json(capsys, path, "--role", "trainer", "--world", "2", "--steps", "1-400")
    assert untold["ranks"][1]["traces"] == entry["traces"]
    assert untold["ranks"][1]["inner_steps"] == 1
    assert main(["explain", path, "--role", "trainer", "--world", "2"]) == 0
    assert "    traces assume 1 prof.step() per outer step (--inner-steps N for more)\n" in \
        capsys.readouterr().out
    # a window that starts later: the capture opens there, its cycles count from there
    later = explain_json(capsys, path, "--role", "trainer", "--world", "2",
                         "--steps", "501-750", "--inner-steps", "1")
    assert [t["name"] for t in later["ranks"][0]["traces"]] == [
        "iteration_600/rank0_trace", "iteration_700/rank0_trace"]
    # two prof.step() a step: cycles of 100 inner steps span 50 training steps
    twice = explain_json(capsys, path, "--role", "trainer", "--world", "2",
                         "--steps", "1-100", "--inner-steps", "2")
    assert [t["name"] for t in twice["ranks"][0]["traces"]] == [
        "iteration_50/rank0_trace", "iteration_100/rank0_trace"]


def test_discrete_regions_are_captures_of_their_own(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    path = write(tmp_path, """\
version: 1
prefix: rl
roles:
  actor:
    enabled: true
    steps: [4, 5]
    discrete: true
    name: "<prefix>_<role>_<region>_step<step>_rank<rank>[_c<cycle>]"
    regions:
      update_actor: {schedule: {warmup: 1, active: 1, repeat: 1}}
      compute_log_prob: {}
      generate: {enabled: false}
""")
    data = explain_json(capsys, path, "--role", "actor", "--world", "2", "--inner-steps", "4")
    assert profiled(data) == [0]
    rank0 = data["ranks"][0]
    assert [(c["steps"], c["region"], c["name"]) for c in rank0["captures"]] == [
        ([4], "update_actor", "rl_actor_update-actor_step4_rank0_c0"),
        ([4], "compute_log_prob", "rl_actor_compute-log-prob_step4_rank0"),
        ([5], "update_actor", "rl_actor_update-actor_step5_rank0_c0"),
        ([5], "compute_log_prob", "rl_actor_compute-log-prob_step5_rank0"),
    ]
    assert rank0["regions"] == {
        "update_actor": ["WARMUP", "RECORD_AND_SAVE", "NONE", "NONE"],
        "compute_log_prob": ["RECORD"] * 4,
    }
    assert rank0["name"] == "rl_actor_update-actor_step4_rank0_c0"


def test_names_keep_late_fields_as_placeholders(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    path = write(tmp_path, """\
version: 1
roles:
  actor:
    enabled: true
    steps: [1]
    name: "<role>/<host>/rank<rank>-pid<pid>-<timestamp>[-<env:SLURM_JOB_ID>]"
""")
    data = explain_json(capsys, path, "--role", "actor", "--world", "1")
    # Only the running process knows its environment: explain shows the field.
    assert data["ranks"][0]["name"] == \
        "actor/<host>/rank0-pid<pid>-<timestamp>-<env:SLURM_JOB_ID>"


def test_ascend_policy(capsys: pytest.CaptureFixture[str]) -> None:
    data = explain_json(capsys, str(POLICIES / "ascend_npu.yaml"), "--role", "actor",
                        "--world", "4", "--inner-steps", "5")
    assert profiled(data) == [0, 1]
    rank1 = data["ranks"][1]
    assert rank1["backend"] == "mstx"
    assert rank1["regions"] == {"update_actor": ["NONE", "WARMUP", "RECORD", "RECORD_AND_SAVE",
                                                 "NONE"]}
    assert rank1["name"] == "grpo-npu_actor_update-actor_step5_rank1-of-4_c0"


# ---------------------------------------------------------------- text


def test_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", str(POLICIES / "verl_ppo.yaml"), "--role", "actor",
                 "--world", "4", "--inner-steps", "3"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "role actor, world 4, outer steps 0-20",
        "  rank 0: profiled with torch, steps 2,3",
        "    actions per inner step: RECORD at every inner step (no schedule: each capture "
        "is recorded whole)",
        # colocate: one window, one name on every rank, though the rollout takes part on
        # rank 0 only (the manifest's `roles` says so); no mesh: no coordinates
        "    rank 0: actor+ref+rollout/step2/ppo-qwen7b_rank0-of-4" + PLACEHOLDERS,
        "  ranks 1-2: not profiled",
        "  rank 3: profiled with torch, steps 2,3",
        "    actions per inner step: RECORD at every inner step (no schedule: each capture "
        "is recorded whole)",
        "    rank 3: actor+ref+rollout/step2/ppo-qwen7b_rank3-of-4" + PLACEHOLDERS,
    ]


def test_text_folds_runs_of_one_action(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", MEGATRON, "--role", "trainer", "--inner-steps", "10"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[2] == (
        "    actions per inner step: NONE WARMUP RECORD RECORD RECORD_AND_SAVE NONE x5")
    assert err == ""  # ten calls per step run the schedule through


@pytest.mark.parametrize(("argv", "said"), [
    # merged steps 10-12, one call each: inner step 3 records, 4 would have saved
    ([MEGATRON, "--role", "trainer", "--inner-steps", "1"],
     "role 'trainer', --inner-steps 1: capture of steps 10-12 ended at inner step 3 (after "
     "3 prof.step() calls), in cycle 0 of schedule {skip_first: 1, warmup: 1, active: 3, "
     "repeat: 1}, which records inner steps 2-4: saved partial with 2 of 3 active steps"),
    # discrete region calls of one mini-batch each: still warming up when they end
    ([str(POLICIES / "ascend_npu.yaml"), "--role", "actor", "--world", "2", "--steps",
      "0-30", "--inner-steps", "1"],
     "role 'actor', --inner-steps 1: capture of step 5 (region update_actor) ended at inner "
     "step 1 (after 1 prof.step() call); schedule {skip_first: 1, warmup: 1, active: 2, "
     "repeat: 1} records from inner step 2: nothing recorded"),
])
def test_inner_steps_that_cut_a_schedule_short_say_so(
        argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    for fmt in ("text", "json"):
        assert main(["explain", *argv, "--format", fmt]) == 0
        assert capsys.readouterr().err == f"policy-engine explain: warning: {said}\n"


def test_inner_steps_enough_for_the_schedule_say_nothing(
        capsys: pytest.CaptureFixture[str]) -> None:
    # three calls: inner step 3 saves the cycle (the stretch after the last call records)
    assert main(["explain", str(POLICIES / "ascend_npu.yaml"), "--role", "actor",
                 "--world", "2", "--inner-steps", "3"]) == 0
    assert capsys.readouterr().err == ""


def test_text_output_shows_coordinates(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", MEGATRON, "--role", "trainer", "--steps", "0-9"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "role trainer, world 8, outer steps 0-9"
    assert lines[1] == "  rank 0: profiled with torch, steps none in range"
    assert lines[3] == "    rank 0 (tp0pp0dp0): trainer/gpt-8b_rank0-of-8_tp0pp0dp0" + PLACEHOLDERS


# ---------------------------------------------------------------- mistakes


def test_unknown_role_gets_the_defaults_with_a_warning(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", MEGATRON, "--role", "trainr", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert profiled(json.loads(out)) == []
    assert err == ("policy-engine explain: warning: role 'trainr' is not in the policy "
                   "(did you mean 'trainer'?); it gets the defaults\n")


@pytest.mark.parametrize(("argv", "message"), [
    (["--role", "actor"], "give --world N (or a mesh in the policy): how many ranks the role has"),
    (["--role", "actor", "--world", "2", "--steps", "9-3"], "--steps '9-3': range is reversed"),
    (["--role", "actor", "--world", "2", "--steps", "x"],
     "--steps 'x': expected A-B or N, such as 1-20"),
])
def test_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", str(POLICIES / "verl_ppo.yaml"), *argv]) == 2
    assert capsys.readouterr().err == f"policy-engine explain: error: {message}\n"


def test_an_invalid_policy_is_not_explained(capsys: pytest.CaptureFixture[str]) -> None:
    invalid = ROOT / "tests" / "data" / "invalid" / "unknown_key.yaml"
    assert main(["explain", str(invalid), "--role", "actor", "--world", "2"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.endswith("error: unknown key 'rnaks' (did you mean 'ranks'?) "
                        "(at $.roles.actor.rnaks)\n")


def test_world_must_match_the_mesh(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", MEGATRON, "--role", "trainer", "--world", "4"]) == 1
    assert "error: mesh pp=2,dp=2,tp=2 has 8 ranks but the world has 4 (at $.mesh)" in (
        capsys.readouterr().err)


def test_unreadable_file_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    assert main(["explain", str(tmp_path / "none.yaml"), "--role", "a", "--world", "1"]) == 2
    assert "cannot read" in capsys.readouterr().err


# ---------------------------------------------------------------- the library side


def test_explain_function() -> None:
    policy = load_policy(MEGATRON)
    data = explain(policy, "trainer", world=8, lo=11, hi=11, inner=2)
    assert profiled(data) == [0, 2, 4, 6]
    assert data["ranks"][4]["steps"] == [11]
    assert data["ranks"][4]["actions"] == ["NONE", "WARMUP"]


@pytest.mark.parametrize(("steps", "merge", "runs"), [
    ([1, 2, 3, 5], True, [(1, 3), (5, 5)]),
    ([1, 2, 3, 5], False, [(1, 1), (2, 2), (3, 3), (5, 5)]),
    ("all", True, [(0, None)]),
    ("18-25", True, [(18, 25)]),
    ([], True, []),
])
def test_opened_captures(steps: object, merge: bool, runs: list[tuple[int, int | None]]) -> None:
    policy = load_policy({"version": 1, "roles": {"r": {
        "enabled": True, "steps": steps, "merge_steps": merge}}})
    plan = compile_plan(policy, "r", Topology())
    found = opened(plan, 0, 20)
    assert [(first, plan.capture_last(first)) for first, _ in found] == runs
    assert [covered for _, covered in found] == [
        tuple(range(a, 21 if b is None else min(b, 20) + 1)) for a, b in runs]
    labels = [plan.capture_label(a) for a, _ in runs]
    assert labels == [f"{a}+" if b is None else str(a) if a == b else f"{a}-{b}"
                      for a, b in runs]


@pytest.mark.parametrize("role_body", [
    {"ranks": "all", "steps": [2, 3]},
    {"ranks": {"dp": [0, -1]}, "steps": "4-6", "merge_steps": True,
     "schedule": {"warmup": 1, "active": 2, "repeat": 1},
     "name": "<role>_<step>_c<cycle>_<rank>_<tp><pp><dp>_<node>_<local_rank>_<host>"},
    {"ranks": "all", "steps": [1], "discrete": True, "regions": ["a", "b"]},
])
def test_every_rank_equals_its_compiled_plan(role_body: dict[str, object]) -> None:
    from policy_engine import Topology, compile_plan
    from policy_engine.plan.predict import default_inner_steps, rank_entry

    body = {"enabled": True, **role_body}
    policy = load_policy({"version": 1, "mesh": {"pp": 2, "dp": 2, "tp": 2},
                          "roles": {"actor": body}})
    data = explain(policy, "actor", world=8, lo=0, hi=10, local_world=4)
    for entry in data["ranks"]:
        if not entry["profiled"]:
            continue
        plan = compile_plan(policy, "actor", Topology.for_rank(
            entry["rank"], 8, dict(policy.mesh), 4))
        assert entry == rank_entry(plan, 0, 10, default_inner_steps(plan))


@pytest.mark.parametrize("world", [1, 4096, 4097, 8192])
def test_json_output_parses_at_any_world(world: int, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nroles: {actor: {enabled: true, ranks: all, steps: [1]}}\n")
    assert main(["explain", str(path), "--role", "actor", "--world", str(world),
                 "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in data["ranks"]] == list(range(world))
    assert data["ranks"][-1]["name"].startswith(f"actor/step1/trace_rank{world - 1}-of-")


# ---------------------------------------------------------------- files with endings

FILES_POLICY = """\
version: 1
output_dir: out
roles:
  both: {enabled: true, backend: [torch, memory], steps: [2], torch: {gzip: false}}
  nsys: {enabled: true, backend: nsight, steps: [2, 3]}
  npu: {enabled: true, backend: mstx, steps: [2], schedule: {warmup: 1, active: 1, repeat: 2}}
"""


def files_of(data: dict[str, Any]) -> list[list[tuple[str, str, str | None]]]:
    return [[(f["backend"], f["path"], f.get("when")) for f in t["files"]]
            for t in data["ranks"][0]["traces"]]


def test_json_names_every_file_with_its_ending(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    path = write(tmp_path, FILES_POLICY)
    both = explain_json(capsys, path, "--role", "both", "--world", "1")
    stem = "both/step2/trace_rank0-of-1" + PLACEHOLDERS
    oom = ("only if the process runs out of memory while this capture runs (at most one "
           "per capture)")
    assert files_of(both) == [[("torch", stem + ".pt.trace.json", None),
                               ("memory", stem + ".pickle", None),
                               ("memory", stem + "_oom.pickle", oom)]]
    # nsys writes one report per capture range of the process, numbered from 1
    nsys = explain_json(capsys, path, "--role", "nsys", "--world", "1")
    assert files_of(nsys) == [[("nsight", f"nsys/trace_rank0-of-1_pid<pid>.{n}.nsys-rep", None)]
                              for n in (1, 2)]
    npu = explain_json(capsys, path, "--role", "npu", "--world", "1")
    assert files_of(npu) == [[(
        "mstx", f"npu/step2/cycle{c}/trace_rank0-of-1{PLACEHOLDERS}_<pid>_<npu_timestamp>"
        "_ascend_pt/", None)] for c in (0, 1)]
    # text output lists no files: it stays short
    assert main(["explain", path, "--role", "both", "--world", "1"]) == 0
    assert ".pickle" not in capsys.readouterr().out


def _as_pattern(path: str) -> str:
    return (re.escape(path.rstrip("/")).replace("<pid>", r"\d+")
            .replace("<timestamp>", r"\d{17}").replace("<npu_timestamp>", r"\d{17}"))


def _run_steps(policy_file: str, role: str, calls: int = 2) -> list[str]:
    from policy_engine import profile_session
    from policy_engine.analysis.manifests import scan_manifests

    policy = load_policy(policy_file)
    with profile_session(policy, role, Topology()) as prof:
        for n in range(1, 4):
            with prof.training_step(n):
                for _ in range(calls):
                    prof.step()
    out = Path(policy.output_dir)
    return [r["path"] for r in scan_manifests(str(out)).records
            if r["event"] == "trace" and r["path"]]


def test_explain_files_are_those_a_torch_run_writes(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    pytest.importorskip("torch")
    path = write(tmp_path, FILES_POLICY.replace("[torch, memory]", "torch")
                 .replace("torch: {gzip: false}", "torch: {gzip: false, activities: [cpu]}"))
    predicted = [f["path"] for t in explain_json(capsys, path, "--role", "both", "--world",
                                                 "1", "--steps", "1-3")["ranks"][0]["traces"]
                 for f in t["files"]]
    written = _run_steps(path, "both")
    assert len(written) == len(predicted) == 1
    assert re.fullmatch(_as_pattern(predicted[0]), written[0]), (predicted, written)


def test_explain_files_are_those_an_ascend_run_writes(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path) -> None:
    from npu_fixtures import installed_fake

    path = write(tmp_path, FILES_POLICY)
    predicted = [f["path"] for t in explain_json(capsys, path, "--role", "npu", "--world",
                                                 "1", "--steps", "1-3", "--inner-steps",
                                                 "4")["ranks"][0]["traces"]
                 for f in t["files"]]
    with installed_fake("2.13.0"):
        written = _run_steps(path, "npu", calls=4)
    assert len(written) == len(predicted) == 2
    for want, got in zip(predicted, written, strict=True):
        assert re.fullmatch(_as_pattern(want), got), (want, got)


def test_memory_files_follow_on_oom_and_history() -> None:
    from policy_engine.backends.files import name_files

    def whens(**settings: Any) -> list[str | None]:
        return [f.get("when") for f in name_files("memory", settings, "out", "a/x", 0)]

    assert whens(on_oom=False) == [None]  # the snapshot only: nothing is dumped on OOM
    assert whens(on_oom=True)[1] is not None and "always" not in str(whens(on_oom=True)[1])
    assert "with history: always" in str(whens(on_oom=True, history="always")[1])


def test_text_folds_long_runs_of_steps(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A long window is one item with its count; short runs stay listed."""
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nroles:\n  trainer:\n    enabled: true\n"
                    "    steps: [\"2-1001\", 1500, 1502, 1503]\n")
    assert main(["explain", str(path), "--role", "trainer", "--world", "1",
                 "--steps", "0-2000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "  rank 0: profiled with torch, steps 2-1001 (1000),1500,1502,1503"
    assert max(map(len, lines)) < 200



def test_text_folds_long_runs_of_periodic_steps(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Periodic steps over a long window are one item too; a short run stays listed."""
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nroles:\n  trainer:\n    enabled: true\n"
                    "    steps: [{every: 100, from: 100}, 7, 9, 11]\n")
    assert main(["explain", str(path), "--role", "trainer", "--world", "1",
                 "--steps", "0-100000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "  rank 0: profiled with torch, steps 7,9,11,100-100000 every 100 (1000)"


# ---------------------------------------------------------------- groups of ranks

LONG = "x" * 245  # a name component of 255 bytes at most, but not with a marker in it
GROUPED = {
    "plain": ("version: 1\nmesh: {pp: 2, dp: 4, tp: 2}\nroles:\n"
              "  r: {enabled: true, ranks: all, steps: [1, 2], schedule: {warmup: 1, active: 1,"
              " repeat: 2}, name: '<role>/<step>/c<cycle>_r<rank>_<tp><pp><dp>_n<node>"
              "_l<local_rank>_<env:JOB>_<host>'}\n", 4),
    "discrete": ("version: 1\nmesh: {dp: 8, tp: 2}\nroles:\n"
                 "  r: {enabled: true, backend: [torch, memory], ranks: {tp: 0}, steps: [2],"
                 " discrete: true, regions: [a, b]}\n", None),
    "nsight": ("version: 1\noutput_dir: out\nmesh: {dp: 16}\nroles:\n"
               "  r: {enabled: true, backend: nsight, ranks: all, steps: [2, 3, 7]}\n", 4),
    "mstx": ("version: 1\nmesh: {dp: 16}\nroles:\n"
             "  r: {enabled: true, backend: mstx, ranks: '3-9', steps: [2],"
             " schedule: {warmup: 1, active: 1, repeat: 2}}\n", None),
    "titan": ("version: 1\nmesh: {dp: 8, tp: 2}\nroles:\n"
              "  r: {enabled: true, ranks: {tp: -1}, steps: {every: 3, from: 1},"
              " merge_steps: true, schedule: {wait: 1, warmup: 1, active: 2, repeat: 2},"
              " limits: {captures: 3}, triggers: {slow_step: {factor: 2.0}}}\n", 2),
    "colocated": ("version: 1\nmesh: {dp: 8, tp: 2}\ncolocate: [[r, ref, gen]]\nroles:\n"
                  "  r: {enabled: true, ranks: all, steps: [1, 2]}\n"
                  "  ref: {enabled: true, ranks: {tp: 0}, steps: [2, 3]}\n"
                  "  gen: {enabled: true, ranks: [0, 5], steps: [1]}\n", 4),
    # a name cut for its length: each rank is compiled on its own
    "cut": (f"version: 1\nmesh: {{dp: 16}}\nroles:\n"
            f"  r: {{enabled: true, ranks: all, steps: [1], name: '{LONG}_<rank>'}}\n", None),
    "mstx_cut": (f"version: 1\nmesh: {{dp: 16}}\nroles:\n"
                 f"  r: {{enabled: true, backend: mstx, ranks: all, steps: [1],"
                 f" name: '{LONG[:210]}_<rank>'}}\n", None),
}


@pytest.mark.parametrize("case", sorted(GROUPED))
def test_each_rank_of_a_group_is_its_own_compiled_plan(case: str, tmp_path: Path) -> None:
    """What explain prints for a rank, from its group, is what compiling that rank gives,
    files and names included."""
    from policy_engine.cli.explain import plan_files
    from policy_engine.plan.predict import entries, rank_entry

    text, local_world = GROUPED[case]
    policy = load_policy(write(tmp_path, text))
    world = 16
    mesh = dict(policy.mesh_for("r")) or None
    found = list(entries(policy, "r", world=world, lo=0, hi=12, inner=None,
                         local_world=local_world, files=plan_files))
    assert [e.place.rank for e in found] == list(range(world))
    groups = {id(e.group) for e in found if e.group is not None}
    assert len(groups) == (4 if case == "colocated" else 1)  # by the roles selecting it
    for entry in found:
        if entry.group is None:
            continue
        plan = compile_plan(policy, "r", Topology.for_rank(entry.place.rank, world, mesh,
                                                           local_world))
        assert entry.group.json(entry.place) == json.dumps(
            rank_entry(plan, 0, 12, None, 1, plan_files))
        assert entry.group.name(entry.place) == rank_entry(plan, 0, 12)["name"]
        assert entry.data() == rank_entry(plan, 0, 12, None, 1, plan_files)
    # names cut for their length are compiled rank by rank; the others are filled in
    assert all(e.group.filled is not case.endswith("cut") for e in found if e.group is not None)


def test_a_group_is_compiled_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from policy_engine.plan import predict

    calls: list[int] = []

    def counted(policy: Any, role: str, topology: Any = None) -> Any:
        calls.append(topology.rank)
        return compile_plan(policy, role, topology)
    monkeypatch.setattr(predict, "compile_plan", counted)
    policy = load_policy({"version": 1, "mesh": {"dp": 64, "tp": 64},
                          "roles": {"r": {"enabled": True, "ranks": {"tp": [0, -1]},
                                          "steps": [1, 2]}}})
    data = explain(policy, "r", world=4096, lo=0, hi=5)
    assert calls == [0]
    assert [e["rank"] for e in data["ranks"] if e["profiled"]][-2:] == [4032, 4095]
    assert data["ranks"][4095]["name"].startswith("r/step1/trace_rank4095-of-4096")
