"""``policy-engine validate``: the corpus of invalid policies, exact lines, every problem.

Each file under ``tests/data/invalid`` holds one problem (a few hold several, to prove that
every problem is reported); the tables below give the exact lines validate prints for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_engine import PolicyError, load_policy
from policy_engine.cli.main import main
from policy_engine.language.load import analyze
from policy_engine.language.read.source import document_from_mapping
from policy_engine.language.rules.checks import COORDINATES_WITHOUT_MESH

DATA = Path(__file__).parent / "data"
INVALID = DATA / "invalid"
VALID = DATA / "valid"

E = "error"

# file -> (extra arguments, exact problem lines)
INVALID_CASES: dict[str, tuple[tuple[str, ...], list[str]]] = {
    # ---- schema: keys
    "unknown_key.yaml": ((), [
        "unknown_key.yaml:7:5: error: unknown key 'rnaks' (did you mean 'ranks'?) "
        "(at $.roles.actor.rnaks)",
    ]),
    "unknown_top_key.yaml": ((), [
        "unknown_top_key.yaml:2:1: error: unknown key 'role' (did you mean 'roles'?) (at $.role)",
    ]),
    "unknown_key_listed.yaml": ((), [
        "unknown_key_listed.yaml:3:25: error: unknown key 'pause' (expected one of skip_first, "
        "skip_first_wait, wait, warmup, active, repeat) (at $.defaults.schedule.pause)",
    ]),
    "unknown_dimension_key.yaml": ((), [
        "unknown_dimension_key.yaml:4:13: error: unknown key 'tq' (did you mean 'tp'?) "
        "(at $.roles.actor.ranks.tq)",
    ]),
    "version_missing.yaml": ((), [
        "version_missing.yaml:1:1: error: missing required key 'version' (add version: 1) (at $)",
    ]),
    "version_wrong.yaml": ((), [
        "version_wrong.yaml:1:10: error: version must be 1, got 2 (at $.version)",
    ]),
    "role_name.yaml": ((), [
        "role_name.yaml:4:3: error: bad role name 'critic!': use a letter, then letters, "
        "digits, _ . + or - (at $.roles['critic!'])",
    ]),
    "duplicate_key.yaml": ((), [
        "duplicate_key.yaml:4:3: error: duplicate key 'actor' (first defined at line 3) "
        "(at $.roles.actor)",
    ]),
    # ---- schema: values
    "backend.yaml": ((), [
        "backend.yaml:3:12: error: backend must be one of torch, mstx, nsight, memory, "
        "vllm, sglang, npu, nsys, torch_memory, got 'torh' (did you mean 'torch'?) "
        "(at $.defaults.backend)",
    ]),
    "enabled_type.yaml": ((), [
        "enabled_type.yaml:4:14: error: enabled must be a boolean, got a string 'yes' "
        "(at $.roles.actor.enabled)",
    ]),
    "on_error.yaml": ((), [
        "on_error.yaml:3:13: error: on_error must be one of warn, raise, got 'ignore' "
        "(at $.defaults.on_error)",
    ]),
    "name_empty.yaml": ((), [
        "name_empty.yaml:3:9: error: name must not be empty (at $.defaults.name)",
    ]),
    "mesh_dimension.yaml": ((), [
        "mesh_dimension.yaml:2:15: error: unknown mesh dimension 'tq' (did you mean 'tp'?) "
        "(at $.mesh.tq)",
    ]),
    "mesh_size_zero.yaml": ((), [
        "mesh_size_zero.yaml:4:7: error: tp must be >= 1, got 0 (at $.mesh.tp)",
    ]),
    "ranks_type.yaml": ((), [
        "ranks_type.yaml:4:12: error: ranks must be an integer, a string, a mapping or a list, "
        "got a boolean true (at $.roles.actor.ranks)",
    ]),
    "ranks_empty_mapping.yaml": ((), [
        "ranks_empty_mapping.yaml:4:12: error: ranks must not be empty (at $.roles.actor.ranks)",
    ]),
    "regions_type.yaml": ((), [
        "regions_type.yaml:4:14: error: regions must be a list or a mapping, "
        "got a string 'update_actor' (at $.roles.actor.regions)",
    ]),
    "region_name.yaml": ((), [
        "region_name.yaml:4:29: error: bad region name 'compute-log-prob': use letters, digits "
        "and _, not starting with a digit (at $.roles.actor.regions[1])",
    ]),
    "region_key_name.yaml": ((), [
        "region_key_name.yaml:6:7: error: bad region name '2nd_pass': use letters, digits "
        "and _, not starting with a digit (at $.roles.actor.regions['2nd_pass'])",
    ]),
    "region_duplicate.yaml": ((), [
        "region_duplicate.yaml:4:14: error: regions lists 'update_actor' more than once "
        "(at $.roles.actor.regions)",
    ]),
    "torch_activity.yaml": ((), [
        "torch_activity.yaml:4:23: error: activities[1] must be one of cpu, cuda, xpu, "
        "got 'gpu' (did you mean 'cuda'?) (at $.defaults.torch.activities[1])",
    ]),
    # ---- schema: schedule (active >= 1 when given, no negative values)
    "schedule_negative.yaml": ((), [
        "schedule_negative.yaml:3:20: error: wait must be >= 0, got -1 "
        "(at $.defaults.schedule.wait)",
    ]),
    "schedule_active_zero.yaml": ((), [
        "schedule_active_zero.yaml:5:13: error: active must be >= 1, got 0 "
        "(at $.defaults.schedule.active)",
    ]),
    "schedule_no_active.yaml": ((), [
        "schedule_no_active.yaml:3:13: error: missing required key 'active' (the steps "
        "recorded in each cycle, >= 1) (at $.defaults.schedule)",
    ]),
    "schedule_type.yaml": ((), [
        "schedule_type.yaml:3:13: error: schedule must be a mapping or null, got a string '1-3' "
        "(at $.defaults.schedule)",
    ]),
    # ---- schema: mstx level and export values
    "mstx_level.yaml": ((), [
        "mstx_level.yaml:5:12: error: level must be one of level_none, level0, level1, level2, "
        "got 'level3' (did you mean 'level2'?) (at $.defaults.mstx.level)",
    ]),
    "mstx_export.yaml": ((), [
        "mstx_export.yaml:4:23: error: export_type must be one of text, db, got 'csv' "
        "(at $.defaults.mstx.export_type)",
    ]),
    "mstx_export_list.yaml": ((), [
        "mstx_export_list.yaml:5:25: error: export_type[1] must be one of text, db, got 'csv' "
        "(at $.defaults.mstx.export_type[1])",
    ]),
    # ---- rank selectors
    "ranks_syntax.yaml": ((), [
        "ranks_syntax.yaml:4:12: error: malformed rank range '0-' (expected N, -N or A-B with "
        "A, B >= 0) (at $.roles.actor.ranks)",
    ]),
    "ranks_reversed.yaml": ((), [
        "ranks_reversed.yaml:4:16: error: range 7-4 is reversed (at $.roles.actor.ranks[1])",
    ]),
    "ranks_out_of_range.yaml": (("--world", "4"), [
        "ranks_out_of_range.yaml:6:16: error: rank 4 is out of range for world 4 "
        "(at $.roles.actor.ranks[1])",
        "ranks_out_of_range.yaml:6:19: error: rank -5 is out of range for world 4 "
        "(at $.roles.actor.ranks[2])",
    ]),
    "ranks_out_of_range_mesh.yaml": ((), [
        "ranks_out_of_range_mesh.yaml:6:28: error: tp 2 is out of range (tp has 2) "
        "(at $.roles.actor.ranks.tp[1])",
    ]),
    "ranks_dimension_not_in_mesh.yaml": ((), [
        "ranks_dimension_not_in_mesh.yaml:6:17: error: dimension 'pp' is not in the mesh "
        "(mesh: dp, tp) (at $.roles.actor.ranks.pp)",
    ]),
    # ---- steps
    "steps_reversed.yaml": ((), [
        "steps_reversed.yaml:4:12: error: range 12-10 is reversed (at $.roles.actor.steps)",
    ]),
    "steps_empty_range.yaml": ((), [
        "steps_empty_range.yaml:4:12: error: malformed step range '' (expected N, A-B or A-B:S) "
        "(at $.roles.actor.steps)",
    ]),
    "steps_negative.yaml": ((), [
        "steps_negative.yaml:4:16: error: step -2 is negative (at $.roles.actor.steps[1])",
    ]),
    "steps_stride.yaml": ((), [
        "steps_stride.yaml:4:12: error: stride must be > 0 in '0-100:0' (at $.roles.actor.steps)",
    ]),
    "steps_periodic.yaml": ((), [
        "steps_periodic.yaml:4:20: error: every must be >= 1, got 0 (at $.roles.actor.steps.every)",
        "steps_periodic.yaml:4:23: error: unknown key 'form' (did you mean 'from'?) "
        "(at $.roles.actor.steps.form)",
        "steps_periodic.yaml:6:47: error: until 100 is before from 200 "
        "(at $.roles.ref.steps[1].until)",
        "steps_periodic.yaml:8:12: error: missing required key 'every' (periodic steps: "
        "{every: 100, from: 100}) (at $.roles.critic.steps)",
    ]),
    # ---- mesh vs world
    "mesh_world.yaml": (("--world", "6"), [
        "mesh_world.yaml:3:7: error: mesh dp=2,tp=2 has 4 ranks but the world has 6 (at $.mesh)",
    ]),
    # ---- name templates
    "name_grammar.yaml": ((), [
        "name_grammar.yaml:3:16: error: bad name template at character 7: unclosed '[' "
        "(at $.defaults.name)",
    ]),
    "name_unknown_field.yaml": ((), [
        "name_unknown_field.yaml:3:21: error: bad name template at character 12: unknown field "
        "<setp> (did you mean <step>?) (at $.defaults.name)",
    ]),
    "name_character.yaml": ((), [
        "name_character.yaml:3:16: error: bad name template at character 7: character ' ' is "
        "not allowed (use letters, digits, . _ = + - or /) (at $.defaults.name)",
    ]),
    "name_dotdot.yaml": ((), [
        "name_dotdot.yaml:3:10: error: bad name template at character 1: '..' cannot be a path "
        "component (names stay under output_dir) (at $.defaults.name)",
    ]),
    "name_absolute.yaml": ((), [
        "name_absolute.yaml:3:10: error: bad name template at character 1: absolute path: a "
        "name is relative to output_dir (at $.defaults.name)",
    ]),
    "name_ranks.yaml": ((), [
        "name_ranks.yaml:8:11: error: the name cannot tell apart the ranks of role 'actor' "
        "(ranks: 0-3); add <rank> (at $.roles.actor.name)",
    ]),
    "name_ranks_mesh.yaml": ((), [
        "name_ranks_mesh.yaml:9:11: error: the name cannot tell apart ranks 0 and 2 of role "
        "'actor'; add <rank> (at $.roles.actor.name)",
    ]),
    "name_steps.yaml": ((), [
        "name_steps.yaml:6:11: error: the name cannot tell apart the captures one rank makes for "
        "role 'actor': steps 2-3 are separate captures; add <step> (at $.roles.actor.name)",
    ]),
    "name_regions.yaml": ((), [
        "name_regions.yaml:8:11: error: the name cannot tell apart the captures one rank makes "
        "for role 'actor': each region call is its own capture (discrete: true); add <region> "
        "(at $.roles.actor.name)",
    ]),
    "name_cycles.yaml": ((), [
        "name_cycles.yaml:3:9: error: the name cannot tell apart the captures one rank makes for "
        "role 'actor': the schedule repeats 3 times within a capture; add <cycle> "
        "(at $.defaults.name)",
    ]),
    "name_merged_cycles.yaml": ((), [
        "name_merged_cycles.yaml:8:11: error: the name cannot tell apart the captures one rank "
        "makes for role 'trainer': the schedule repeats without end (repeat: 0) within a "
        "capture; add <cycle> or <step> (at $.roles.trainer.name)",
        "name_merged_cycles.yaml:13:11: error: the name cannot tell apart the captures one rank "
        "makes for role 'ref': steps every 100 from 100 are separate captures; add <step> "
        "(at $.roles.ref.name)",
    ]),
    # ---- backend settings and cross-field rules
    "activities_empty.yaml": ((), [
        "activities_empty.yaml:5:19: error: activities is empty: list at least one of cpu, cuda "
        "(an empty list never means all) (at $.roles.actor.torch.activities)",
    ]),
    "mstx_activities_empty.yaml": ((), [
        "mstx_activities_empty.yaml:5:24: error: activities is empty: list at least one of cpu, "
        "npu (an empty list never means all) (at $.roles.actor.mstx.activities)",
    ]),
    "discrete_merge.yaml": ((), [
        "discrete_merge.yaml:7:18: error: discrete: true cannot be combined with merge_steps: "
        "true (each region call is its own capture) (at $.roles.actor.merge_steps)",
    ]),
    # ---- syntax, per format
    "tab_indent.yaml": ((), [
        "tab_indent.yaml:3:1: error: tabs cannot indent YAML; use spaces (at $)",
    ]),
    "bad_syntax.toml": ((), [
        "bad_syntax.toml:2:13: error: Expected ']' at the end of a table declaration (at $)",
    ]),
    "bad_syntax.json": ((), [
        "bad_syntax.json:2:38: error: Expecting property name enclosed in double quotes (at $)",
    ]),
    # ---- extends: a problem is reported in the file that holds it
    "extends_base.yaml": ((), [
        "bases/base.yaml:6:3: error: unknown key 'shedule' (did you mean 'schedule'?) "
        "(at $.defaults.shedule)",
        "extends_base.yaml:6:12: error: malformed rank range '0-' (expected N, -N or A-B with "
        "A, B >= 0) (at $.roles.actor.ranks)",
    ]),
    "extends_cycle.yaml": ((), [
        "extends_cycle.yaml:1:10: error: extends cycle: extends_cycle.yaml -> extends_cycle.yaml "
        "(at $.extends)",
    ]),
    "extends_missing.yaml": ((), [
        "extends_missing.yaml:2:28: error: cannot read bases/missing.yaml: No such file or "
        "directory (at $.extends[1])",
    ]),
    # ---- several problems: every one is reported, ranked (structure first)
    "several.yaml": ((), [
        "several.yaml:4:1: error: unknown key 'outptu_dir' (did you mean 'output_dir'?) "
        "(at $.outptu_dir)",
        "several.yaml:7:33: error: active must be >= 1, got 0 (at $.defaults.schedule.active)",
        "several.yaml:11:12: error: malformed rank range '0-' (expected N, -N or A-B with "
        "A, B >= 0) (at $.roles.actor.ranks)",
        "several.yaml:12:12: error: range 5-3 is reversed (at $.roles.actor.steps)",
        "several.yaml:13:19: error: bad name template at character 8: unknown field <stpe> "
        "(did you mean <step>?) (at $.roles.actor.name)",
        "several.yaml:15:14: error: enabled must be a boolean, got an integer 1 "
        "(at $.roles.critic.enabled)",
        "several.yaml:17:25: error: activities is empty: list at least one of cpu, cuda "
        "(an empty list never means all) (at $.roles.critic.torch.activities)",
    ]),
    "several.toml": ((), [
        "several.toml:6:11: error: backend must be one of torch, mstx, nsight, memory, "
        "vllm, sglang, npu, nsys, torch_memory, got 'torh' (did you mean 'torch'?) "
        "(at $.defaults.backend)",
        "several.toml:7:12: error: active must be >= 1, got 0 (at $.defaults.schedule.active)",
        "several.toml:11:1: error: unknown key 'rnaks' (did you mean 'ranks'?) "
        "(at $.roles.actor.rnaks)",
        "several.toml:12:9: error: range 5-3 is reversed (at $.roles.actor.steps)",
        "several.toml:13:8: error: bad name template at character 8: '..' cannot be a path "
        "component (names stay under output_dir) (at $.roles.actor.name)",
    ]),
    "several.json": ((), [
        "several.json:3:27: error: backend must be one of torch, mstx, nsight, memory, "
        "vllm, sglang, npu, nsys, torch_memory, got 'torh' (did you mean 'torch'?) "
        "(at $.defaults.backend)",
        "several.json:3:71: error: active must be >= 1, got 0 (at $.defaults.schedule.active)",
        "several.json:7:7: error: unknown key 'rnaks' (did you mean 'ranks'?) "
        "(at $.roles.actor.rnaks)",
        "several.json:8:16: error: range 5-3 is reversed (at $.roles.actor.steps)",
        "several.json:9:23: error: bad name template at character 8: '..' cannot be a path "
        "component (names stay under output_dir) (at $.roles.actor.name)",
    ]),
    "semantic_several.yaml": (("--world", "4"), [
        "semantic_several.yaml:8:16: error: rank 9 is out of range for world 4 "
        "(at $.roles.actor.ranks[1])",
        "semantic_several.yaml:11:11: error: the name cannot tell apart the captures one rank "
        "makes for role 'critic': steps 1-2 are separate captures; add <step> "
        "(at $.roles.critic.name)",
        "semantic_several.yaml:15:18: error: discrete: true cannot be combined with merge_steps: "
        "true (each region call is its own capture) (at $.roles.ref.merge_steps)",
        "semantic_several.yaml:18:12: warning: ranks: [] selects no rank: nothing is profiled "
        "for role 'rollout' (at $.roles.rollout.ranks)",
    ]),
    # ---- every problem at once: world-dependent problems beside those of the schema and
    # the values, in roles (and defaults) that hold a refused value
    "world_beside_schema.yaml": ((), [
        "world_beside_schema.yaml:4:11: error: unknown key 'activites' (did you mean "
        "'activities'?) (at $.defaults.torch.activites)",
        "world_beside_schema.yaml:8:16: error: rank 9 is out of range for world 8 "
        "(at $.roles.actor.ranks[1])",
        "world_beside_schema.yaml:10:5: error: unknown key 'bogus' (at $.roles.actor.bogus)",
        "world_beside_schema.yaml:13:17: error: tp 7 is out of range (tp has 4) "
        "(at $.roles.critic.ranks.tp)",
        "world_beside_schema.yaml:14:24: error: active must be >= 1, got 0 "
        "(at $.roles.critic.schedule.active)",
        "world_beside_schema.yaml:17:11: error: mesh dp=3 of role 'ref' has 3 ranks but the "
        "world has 8 (the size of the top-level mesh dp=2,tp=4) (at $.roles.ref.mesh)",
        "world_beside_schema.yaml:18:19: error: bad name template at character 8: "
        "unclosed '<' (at $.roles.ref.name)",
    ]),
}

# Valid files: the warnings each prints (none for most).
VALID_CASES: dict[str, list[str]] = {
    "minimal.yaml": ["minimal.yaml:1:1: warning: no role is enabled: the policy profiles "
                     "nothing (set enabled: true on a role under roles, or in defaults) (at $)"],
    "full.yaml": [],
    "policy.toml": [],
    "policy.json": [],
    "warn_ranks_none.yaml": [
        "warn_ranks_none.yaml:5:12: warning: ranks: [] selects no rank: nothing is profiled for "
        "role 'actor' (at $.roles.actor.ranks)",
    ],
    "warn_steps_none.yaml": [
        "warn_steps_none.yaml:5:12: warning: steps: [] selects no step: nothing is profiled for "
        "role 'actor' (at $.roles.actor.steps)",
    ],
    "warn_steps_unbounded.yaml": [
        "warn_steps_unbounded.yaml:3:10: warning: steps: all profiles every training step for "
        "roles 'actor' and 'ref': a long run writes a trace per step; list the steps or give a "
        "range such as '10-12' (at $.defaults.steps)",
    ],
    "periodic.yaml": [],
    "warn_region_schedule.yaml": [
        "warn_region_schedule.yaml:7:32: warning: region 'update_actor' has its own schedule, "
        "which only applies with discrete: true "
        "(at $.roles.actor.regions.update_actor.schedule)",
    ],
}


def validate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    """Run validate; return the exit code, stdout's lines and stderr."""
    code = main(["validate", *argv])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_every_corpus_file_has_a_case() -> None:
    assert sorted(p.name for p in INVALID.iterdir() if p.is_file()) == sorted(INVALID_CASES)
    assert sorted(p.name for p in VALID.iterdir() if p.is_file()) == sorted(VALID_CASES)


@pytest.mark.parametrize("name", sorted(INVALID_CASES))
def test_invalid_file(name: str, capsys: pytest.CaptureFixture[str],
                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(INVALID)
    args, expected = INVALID_CASES[name]
    code, lines, err = validate(capsys, name, *args)
    assert lines[:-1] == expected
    errors = sum(": error: " in line for line in expected)
    warnings = len(expected) - errors
    detail = ", ".join(f"{n} {w}{'s' if n != 1 else ''}"
                       for n, w in ((errors, "error"), (warnings, "warning")) if n)
    assert lines[-1] == f"{name}: invalid ({detail})"
    assert (code, err) == (1, "")


@pytest.mark.parametrize("name", sorted(VALID_CASES))
def test_valid_file(name: str, capsys: pytest.CaptureFixture[str],
                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(VALID)
    code, lines, _ = validate(capsys, name, "--world", "8")
    expected = VALID_CASES[name]
    summary = f"{name}: valid" + (f" ({len(expected)} warning{'s' * (len(expected) > 1)})"
                                  if expected else "")
    assert (code, lines) == (0, [*expected, summary])


@pytest.mark.parametrize("name", [n for n, lines in VALID_CASES.items() if lines])
def test_strict_turns_warnings_into_errors(name: str, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(VALID)
    code, lines, _ = validate(capsys, name, "--strict", "--world", "8")
    assert code == 1
    assert lines[:-1] == [line.replace(": warning: ", ": error: ", 1)
                          for line in VALID_CASES[name]]
    assert lines[-1] == f"{name}: invalid (1 error)"


def test_every_file_is_checked_and_the_worst_exit_code_wins(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(DATA)
    code, lines, _ = validate(capsys, "valid/minimal.yaml", "invalid/backend.yaml",
                              "invalid/unknown_key.yaml", "valid/policy.toml")
    assert code == 1
    summaries = [line for line in lines if line.endswith(("valid", ")"))
                 and ": error: " not in line and ": warning: " not in line]
    assert summaries == ["valid/minimal.yaml: valid (1 warning)",
                         "invalid/backend.yaml: invalid (1 error)",
                         "invalid/unknown_key.yaml: invalid (1 error)",
                         "valid/policy.toml: valid"]
    code, lines, _ = validate(capsys, "invalid/backend.yaml", "missing.yaml")
    assert code == 2
    assert lines[-2:] == [
        "missing.yaml: error: cannot read missing.yaml: No such file or directory (at $)",
        "missing.yaml: unreadable (1 error)",
    ]


@pytest.mark.parametrize("name", ["policy.txt", "no_extension"])
def test_unsupported_file_is_a_usage_error(name: str, capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    (tmp_path / name).write_text("version: 1\n")
    code, lines, _ = validate(capsys, str(tmp_path / name))
    assert code == 2
    assert "unsupported extension" in lines[0]


def test_json_format_lists_every_problem(capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(DATA)
    code = main(["validate", "--format", "json", "--world", "4",
                 "invalid/semantic_several.yaml", "valid/minimal.yaml"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert report["valid"] is False
    [bad, good] = report["files"]
    assert good == {"file": "valid/minimal.yaml", "valid": True, "notes": [], "problems": [{
        "file": "valid/minimal.yaml", "line": 1, "column": 1, "json_path": "$",
        "severity": "warning", "message": "no role is enabled: the policy profiles nothing "
        "(set enabled: true on a role under roles, or in defaults)"}]}
    assert bad["file"] == "invalid/semantic_several.yaml"
    assert bad["valid"] is False
    assert bad["problems"][0] == {
        "file": "invalid/semantic_several.yaml", "line": 8, "column": 16,
        "json_path": "$.roles.actor.ranks[1]", "severity": "error",
        "message": "rank 9 is out of range for world 4",
    }
    assert [(p["line"], p["severity"]) for p in bad["problems"]] == [
        (8, "error"), (11, "error"), (15, "error"), (18, "warning")]
    for problem in bad["problems"]:
        assert set(problem) == {"file", "line", "column", "json_path", "severity", "message"}


def test_json_format_of_a_valid_file(capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(VALID)
    assert main(["validate", "--format", "json", "warn_steps_none.yaml"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is True
    [problem] = report["files"][0]["problems"]
    assert (problem["severity"], problem["line"], problem["column"]) == ("warning", 5, 12)


# ---------------------------------------------------------------- --world and --mesh


def test_mesh_option_replaces_the_policys_mesh(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(INVALID)
    code, lines, _ = validate(capsys, "ranks_dimension_not_in_mesh.yaml",
                              "--mesh", "pp=2,dp=2,tp=2")
    assert code == 0
    assert lines == [
        "ranks_dimension_not_in_mesh.yaml:2:7: warning: --mesh pp=2,dp=2,tp=2 replaces the "
        "policy's mesh dp=2,tp=2 (at $.mesh)",
        "ranks_dimension_not_in_mesh.yaml: valid (1 warning)",
    ]


def test_mesh_option_checks_dimensions_and_world(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(VALID)
    code, lines, _ = validate(capsys, "full.yaml", "--mesh", "dp=2,tp=2", "--world", "8")
    assert code == 1
    assert lines == [
        "full.yaml:6:7: warning: --mesh dp=2,tp=2 replaces the policy's mesh pp=2,dp=2,tp=2 "
        "(at $.mesh)",
        "full.yaml:6:7: error: mesh dp=2,tp=2 has 4 ranks but the world has 8 (at $.mesh)",
        "full.yaml: invalid (1 error, 1 warning)",
    ]


def test_world_checks_the_names_rank_by_rank(capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(INVALID)
    code, lines, _ = validate(capsys, "name_ranks.yaml", "--world", "8")
    assert code == 1
    assert lines[0] == ("name_ranks.yaml:8:11: error: the name cannot tell apart ranks 0 and 1 "
                        "of role 'actor'; add <rank> (at $.roles.actor.name)")


@pytest.mark.parametrize("argv", [
    ["--world", "0"], ["--world", "x"], ["--mesh", "pp=2,xx=2"], ["--mesh", "tp=0"],
    ["--format", "xml"], [],
])
def test_bad_options_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    files = [] if not argv else [str(VALID / "minimal.yaml")]
    assert main(["validate", *files, *argv]) == 2
    assert "usage: policy-engine validate" in capsys.readouterr().err


# ---------------------------------------------------------------- overrides


def test_set_overrides_the_file(capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(VALID)
    code, lines, _ = validate(capsys, "warn_ranks_none.yaml", "--set", "roles.actor.ranks=all")
    assert (code, lines) == (0, ["warn_ranks_none.yaml: valid"])


def test_a_bad_override_is_reported_as_the_override(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(VALID)
    code, lines, _ = validate(capsys, "minimal.yaml", "--set", "roles.actor.ranks=bogus")
    assert code == 1
    assert lines == [
        "--set roles.actor.ranks=bogus: error: malformed rank range 'bogus' (expected N, -N or "
        "A-B with A, B >= 0) (at $.roles.actor.ranks)",
        "minimal.yaml: invalid (1 error)",
    ]


def test_every_bad_override_is_reported(capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(VALID)
    monkeypatch.setenv("PROFILE_POLICY_SET", "roles.ref.steps=[1")
    code, lines, _ = validate(capsys, "minimal.yaml", "--set", "roles.actor.ranks=[0",
                              "--set", "nonsense", "--set", "roles.actor.rnaks=1")
    assert code == 1
    assert lines == [
        "--set roles.actor.ranks=[0: error: did not find expected ',' or ']' (while parsing a "
        "flow sequence started at line 1, column 1) (at $.roles.actor.ranks)",
        "--set nonsense: error: override needs KEY=VALUE, got 'nonsense' (at $)",
        "PROFILE_POLICY_SET[1]: roles.ref.steps=[1: error: did not find expected ',' or ']' "
        "(while parsing a flow sequence started at line 1, column 1) (at $.roles.ref.steps)",
        "minimal.yaml: invalid (3 errors)",
    ]


def test_environment_overrides_are_checked(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(VALID)
    monkeypatch.setenv("PROFILE_POLICY_SET",
                       "roles.actor.ranks=all; roles.ref.stepz=1;roles.ref.backend=nsys")
    code, lines, _ = validate(capsys, "warn_ranks_none.yaml")
    assert code == 1
    assert lines == [
        "PROFILE_POLICY_SET[2]: roles.ref.stepz=1: error: unknown key 'stepz' "
        "(did you mean 'steps'?) (at $.roles.ref.stepz)",
        "warn_ranks_none.yaml: invalid (1 error)",
    ]
    monkeypatch.setenv("PROFILE_POLICY_SET", "roles.actor.ranks=all")
    code, lines, _ = validate(capsys, "warn_ranks_none.yaml")
    assert (code, lines) == (0, ["warn_ranks_none.yaml: valid"])


def test_set_and_environment_both_apply(capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(VALID)
    monkeypatch.setenv("PROFILE_POLICY_SET", "roles.actor.steps=[1, 2]")
    code, lines, _ = validate(capsys, "warn_steps_none.yaml", "--set",
                              "roles.actor.name=<role>_rank<rank>")
    assert code == 1
    assert lines[0] == (
        "--set roles.actor.name=<role>_rank<rank>: error: the name cannot tell apart the "
        "captures one rank makes for role 'actor': steps 1-2 are separate captures; add <step> "
        "(at $.roles.actor.name)")


# ---------------------------------------------------------------- the library agrees


def test_load_policy_raises_every_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(INVALID)
    with pytest.raises(PolicyError) as info:
        load_policy("several.yaml")
    assert [p.render() for p in info.value.problems] == INVALID_CASES["several.yaml"][1]


def test_load_policy_reads_overrides_as_validate_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """One pipeline: ``overrides`` (the CLI's --set), then PROFILE_POLICY_SET, every bad one
    reported, before the file is read."""
    monkeypatch.chdir(VALID)
    monkeypatch.setenv("PROFILE_POLICY_SET", "roles.ref.steps=[1")
    with pytest.raises(PolicyError) as info:
        load_policy("missing.yaml", overrides=["roles.actor.ranks=[0", "nonsense"])
    assert [p.render() for p in info.value.problems] == [
        "--set roles.actor.ranks=[0: error: did not find expected ',' or ']' (while parsing a "
        "flow sequence started at line 1, column 1) (at $.roles.actor.ranks)",
        "--set nonsense: error: override needs KEY=VALUE, got 'nonsense' (at $)",
        "PROFILE_POLICY_SET[1]: roles.ref.steps=[1: error: did not find expected ',' or ']' "
        "(while parsing a flow sequence started at line 1, column 1) (at $.roles.ref.steps)",
    ]
    monkeypatch.setenv("PROFILE_POLICY_SET", "roles.actor.steps=[1, 2]")
    with pytest.raises(PolicyError) as info:
        load_policy("warn_steps_none.yaml", overrides=["roles.actor.name=<role>_rank<rank>"])
    assert info.value.problems[0].render().startswith(
        "--set roles.actor.name=<role>_rank<rank>: error: the name cannot tell apart")


def test_load_policy_keeps_warnings_and_strict_raises_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(VALID)
    policy = load_policy("warn_steps_none.yaml")
    assert [p.render() for p in policy.warnings] == VALID_CASES["warn_steps_none.yaml"]
    with pytest.raises(PolicyError):
        load_policy("warn_steps_none.yaml", strict=True)


# ---------------------------------------------------------------- periodic steps

TORCHTITAN = {"wait": 96, "warmup": 3, "active": 1, "repeat": 0}


def _problems(role: dict[str, Any]) -> list[str]:
    """Every problem of a policy with one enabled role, as ``severity: message``."""
    data = {"version": 1, "roles": {"r": {"enabled": True, **role}}}
    try:
        policy = load_policy(data)
    except PolicyError as err:
        return [f"{p.severity}: {p.message}" for p in err.problems]
    return [f"warning: {p.message}" for p in policy.warnings]


@pytest.mark.parametrize(("role", "expected"), [
    # torchtitan's shape: one capture; <step> renders each cycle's own step
    ({"steps": "all", "merge_steps": True, "schedule": TORCHTITAN}, []),
    ({"steps": "all", "merge_steps": True, "schedule": TORCHTITAN,
      "name": "iteration_<step>/rank<rank>_trace"}, []),
    ({"steps": "all", "merge_steps": True, "schedule": TORCHTITAN,
      "name": "<role>_c<cycle>_rank<rank>"}, []),  # one capture: <step> not needed
    ({"steps": {"every": 1, "from": 10}, "merge_steps": True, "schedule": TORCHTITAN,
      "name": "<role>_c<cycle>_rank<rank>"}, []),
    ({"steps": "all", "merge_steps": True, "schedule": TORCHTITAN, "name": "<role>_rank<rank>"},
     ["error: the name cannot tell apart the captures one rank makes for role 'r': the "
      "schedule repeats without end (repeat: 0) within a capture; add <cycle> or <step>"]),
    # separate captures need <step> (the cycle alone repeats in each)
    ({"steps": ["0-3", {"every": 1, "from": 10}], "merge_steps": True, "schedule": TORCHTITAN,
      "name": "<role>_c<cycle>_rank<rank>"},
     ["error: the name cannot tell apart the captures one rank makes for role 'r': steps "
      "0-3,every 1 from 10 are separate captures; add <step>"]),
    # periodic steps are not every step: no warning
    ({"steps": {"every": 100}}, []),
    ({"steps": {"every": 2, "from": 1}, "schedule": {"active": 1, "repeat": 1}}, []),
    ({"steps": {"every": 1, "from": 5}},
     ["warning: steps: every 1 from 5 profiles every training step for role 'r': a long run "
      "writes a trace per step; list the steps or give a range such as '10-12'"]),
    # a merged capture that records every inner step, forever, is still warned about
    ({"steps": "all", "merge_steps": True, "schedule": {"active": 1}},
     ["warning: steps: all profiles every training step for role 'r': a long run writes a "
      "trace per step; list the steps or give a range such as '10-12'"]),
    ({"steps": "all", "merge_steps": True, "schedule": {"active": 2, "repeat": 3}}, []),
])
def test_periodic_steps_and_merged_cycles(role: dict[str, Any], expected: list[str]) -> None:
    assert _problems(role) == expected


# ---------------------------------------------------------------- any input


_scalars = st.none() | st.booleans() | st.integers(-3, 9) | st.sampled_from(
    ["", "all", "0-3", "3-1", "-1", "x", "torch", "mstx", "nsys", "text", "level0",
     "<role>_<rank>", "<role>", "a/../b", "<step>_<region>_<rank>", "1-100:0", "1,,2", "5-9:2"])
_keys = st.sampled_from(["active", "wait", "repeat", "tp", "dp", "pp", "local_rank", "enabled",
                         "schedule", "activities", "export_type", "level", "update_actor",
                         "every", "from", "until"])
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(_keys, inner, max_size=3), max_leaves=8)
_role = st.dictionaries(st.sampled_from(
    ["enabled", "backend", "ranks", "steps", "schedule", "regions", "name", "torch", "mstx",
     "merge_steps", "discrete", "on_error"]), _values, max_size=6)


@settings(max_examples=150, deadline=None)
@given(_role, st.dictionaries(st.sampled_from(["actor", "ref"]), _role, max_size=2),
       st.none() | st.dictionaries(st.sampled_from(["tp", "dp", "zz"]), st.integers(0, 3),
                                   max_size=2),
       st.none() | st.integers(1, 16))
def test_checking_never_crashes(defaults: dict[str, Any], roles: dict[str, Any],
                                mesh: dict[str, int] | None, world: int | None) -> None:
    """Whatever a policy holds, analysis returns problems: it never raises."""
    data: dict[str, Any] = {"version": 1, "defaults": defaults, "roles": roles}
    if mesh is not None:
        data["mesh"] = mesh
    result = analyze(document_from_mapping(data), world=world)
    for problem in result.problems:
        assert problem.json_path.startswith("$")
        assert problem.message


def test_coordinate_selector_without_a_mesh_warns(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nroles:\n  actor:\n    enabled: true\n    steps: [1]\n"
                    "    ranks: {tp: 0, node: 0}\n")
    code, out, _ = validate(capsys, str(path))
    assert code == 0
    assert out[0] == (
        f"{path}:6:12: warning: ranks select by tp but the policy has no mesh: these "
        "coordinates must come from a DeviceMesh or Megatron at run time, else no rank of "
        "role 'actor' is profiled (at $.roles.actor.ranks)")
    code, _, _ = validate(capsys, str(path), "--mesh", "tp=2")
    assert code == 0


def test_a_mapping_selector_in_a_message_keeps_its_braces(capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nroles:\n  actor:\n    enabled: true\n    steps: [1]\n"
                    "    ranks: {local_rank: '0-3'}\n    name: <role>_<step>\n")
    code, out, _ = validate(capsys, str(path))
    assert code == 1
    assert out[0] == (
        f"{path}:7:11: error: the name cannot tell apart the ranks of role 'actor' "
        '(ranks: {"local_rank": "0-3"}); add <rank> (at $.roles.actor.name)')


def test_names_of_a_huge_mesh_are_checked_by_blocks(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nmesh: {dp: 99999999999, tp: 8}\nroles:\n  actor:\n"
                    "    enabled: true\n    steps: [1]\n    ranks: '3-99999999999'\n"
                    "    name: <role>_<tp>\n")
    code, out, _ = validate(capsys, str(path), "--world", str(8 * 99999999999))
    assert code == 1
    assert out[0] == (f"{path}:8:11: error: the name cannot tell apart ranks 3 and 11 of role "
                      "'actor'; add <rank> (at $.roles.actor.name)")


def test_the_no_mesh_warning_has_a_code_the_runtime_filters_on() -> None:
    data = {"version": 1, "roles": {"actor": {"enabled": True, "steps": [1], "ranks": {"tp": 0}}}}
    [warning] = analyze(document_from_mapping(data)).warnings
    assert warning.code == COORDINATES_WITHOUT_MESH
    assert "code" not in warning.to_json()  # not part of the output


# ---------------------------------------------------------------- every problem at once


def test_world_problems_are_reported_beside_the_others() -> None:
    """A role with a refused value is still checked against the world on what it holds
    that is sound, and the problems of a whole role are not repeated."""
    data = {"version": 1, "roles": {
        "actor": {"enabled": True, "ranks": [9], "steps": [2], "bogus": 1},
        "critic": {"enabled": True, "ranks": "0-3", "steps": "3-1"}}}
    result = analyze(document_from_mapping(data), world=8)
    assert [(p.json_path, p.message) for p in result.problems] == [
        ("$.roles.actor.bogus", "unknown key 'bogus'"),
        ("$.roles.critic.steps", "range 3-1 is reversed"),
        ("$.roles.actor.ranks[0]", "rank 9 is out of range for world 8"),
    ]
    # once the other problems are fixed, the same world problem (and nothing new) is left
    del data["roles"]["actor"]["bogus"]  # type: ignore[attr-defined]
    data["roles"]["critic"]["steps"] = "1-3"  # type: ignore[index]
    result = analyze(document_from_mapping(data), world=8)
    assert [(p.json_path, p.message) for p in result.problems] == [
        ("$.roles.actor.ranks[0]", "rank 9 is out of range for world 8")]


def test_a_refused_ranks_or_mesh_is_not_checked_against_the_world() -> None:
    data = {"version": 1, "defaults": {"ranks": "x"}, "roles": {
        "actor": {"enabled": True, "mesh": {"dp": 0}, "ranks": {"dp": 5}},
        "ref": {"enabled": True}}}
    result = analyze(document_from_mapping(data), world=4)
    assert all("out of range" not in p.message for p in result.problems), result.problems


def test_ranks_no_world_can_check_are_named_in_a_note(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nroles:\n  actor:\n    enabled: true\n    ranks: [0, 99]\n"
                    "    steps: [1]\n  critic:\n    enabled: true\n    ranks: all\n"
                    "    steps: [1]\n")
    code, lines, _ = validate(capsys, str(path))
    assert code == 0
    assert lines == [f"{path}: note: ranks of actor were not checked against a world size "
                     "(none is known before the job starts): give --world N, or a mesh, to "
                     "check them", f"{path}: valid"]
    code, lines, _ = validate(capsys, str(path), "--world", "8")
    assert code == 1 and lines[0].endswith("rank 99 is out of range for world 8 "
                                           "(at $.roles.actor.ranks[1])")
    assert main(["validate", "--format", "json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["files"][0]["notes"][0].startswith(
        "ranks of actor were not checked")


def test_problems_come_in_the_order_of_the_file_and_point_at_the_character(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nroles:\n  actor:\n    enabled: true\n"
                    "    name: <role>_<rank>_<bogus>\n"          # line 5: a value's problem
                    "    torch: {activities: [gpu]}\n"           # line 6: the schema's
                    "  critic: {enabled: 1}\n")                  # line 7: the schema's
    code, lines, _ = validate(capsys, str(path))
    assert code == 1
    assert [line.split(": error: ")[0] for line in lines[:-1]] == [
        f"{path}:5:25", f"{path}:6:26", f"{path}:7:21"]
    assert "unknown field <bogus>" in lines[0]  # column 25: the '<' of <bogus>


@pytest.mark.parametrize(("roles", "expected"), [
    ({"actor": {"enabled": False}}, ["7:3: warning: no role is enabled: the policy profiles "
                                     "nothing (set enabled: true on a role under roles, or in "
                                     "defaults) (at $.roles)"]),
    ({}, []),  # defaults.enabled: true below
    ({"actor": {"enabled": True}}, []),
])
def test_a_policy_that_enables_no_role_is_valid_with_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], roles: dict[str, Any],
        expected: list[str]) -> None:
    body = {"version": 1, "defaults": {"enabled": not roles, "steps": [2]}, "roles": roles}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    code, lines, _ = validate(capsys, str(path))
    assert code == 0
    assert [line.removeprefix(f"{path}:") for line in lines
            if ": warning: " in line] == expected
    if expected:  # --strict fails on it, as on every warning
        assert validate(capsys, "--strict", str(path))[0] == 1


@pytest.mark.parametrize(("name", "close"), [
    ("actr", "actor"), ("reff", "ref"), ("Actor", "actor"), ("rollot", "rollout"),
    ("crtic", "critic"), ("actors", "actor"),
    ("r", None), ("critic2", None), ("rollout_vllm", None), ("reward", None),
    ("trainer", None), ("value", None),
])
def test_a_role_named_one_slip_away_from_a_verl_role_is_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
        close: str | None) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "roles": {
        name: {"enabled": True, "steps": [2]}}}))
    code, lines, _ = validate(capsys, "--format", "json", str(path))
    found = [p["message"] for p in json.loads("\n".join(lines))["files"][0]["problems"]]
    assert code == 0
    assert found == ([] if close is None else [
        f"role {name!r} looks like a misspelling of {close!r} (did you mean {close!r}?), a "
        f"role verl's workers are profiled as: a process asking for role {close!r} does not "
        "get this one"])
