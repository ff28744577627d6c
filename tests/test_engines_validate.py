"""What validate refuses of an engine role, engine-args' output, and the file-name parsers."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policy_engine.backends.engine import files
from policy_engine.cli.main import main
from policy_engine.language.load import analyze, read_source

ROOT = Path(__file__).resolve().parent.parent


def _problems(rollout: dict[str, Any], **top: Any) -> list[tuple[str, str, str]]:
    body: dict[str, Any] = {"enabled": True, "backend": "vllm", "mesh": {"dp": 2, "tp": 2},
                            "ranks": "all", "steps": [2]}
    body.update(rollout)
    data = {"version": 1, "output_dir": "/tmp/x", "roles": {"rollout": body}, **top}
    result = analyze(read_source(data, []))
    return [(p.severity, p.message, p.json_path) for p in result.problems]


def _errors(rollout: dict[str, Any]) -> list[str]:
    return [m for s, m, _ in _problems(rollout) if s == "error"]


@pytest.mark.parametrize(("rollout", "expected", "path"), [
    ({"ranks": {"tp": 0}}, "ranks select ranks 0 of replica dp=0 but not 1: an engine "
     "profiles all ranks of a replica at once", "$.roles.rollout.ranks"),
    ({"schedule": {"active": 2, "repeat": 2}}, "vLLM cannot follow this schedule: repeat: 2",
     "$.roles.rollout.schedule"),
    ({"schedule": {"active": 2, "repeat": 1, "skip_first_wait": 1}}, "skip_first_wait",
     "$.roles.rollout.schedule"),
    ({"discrete": True, "regions": ["generate"]}, "discrete: true has nothing to capture",
     "$.roles.rollout.discrete"),
    ({"vllm": {"torch_profiler_dir": "traces"}}, "torch_profiler_dir 'traces' is relative",
     "$.roles.rollout.vllm.torch_profiler_dir"),
    ({"vllm": {"torch_profiler_activities": []}}, "torch_profiler_activities is empty",
     "$.roles.rollout.vllm.torch_profiler_activities"),
    ({"mesh": {"cp": 2, "tp": 2}}, "names its files by dp, pp, tp, ep only, not cp",
     "$.roles.rollout.mesh"),
    ({"triggers": {"on_demand": True}}, "triggers cannot reach a vllm engine",
     "$.roles.rollout.triggers"),
    ({"backend": ["vllm", "memory"]}, "memory would record the driving process",
     "$.roles.rollout.backend"),
    ({"backend": "sglang", "schedule": {"wait": 1, "active": 2, "repeat": 1}},
     "only {active: N, repeat: 1} maps onto SGLang", "$.roles.rollout.schedule"),
    ({"backend": "sglang", "sglang": {"merge_profiles": True}}, "merge_profiles: true",
     "$.roles.rollout.sglang.merge_profiles"),
    ({"backend": "sglang", "sglang": {"profile_by_stage": True}},
     "profile_by_stage needs schedule", "$.roles.rollout.sglang"),
    ({"backend": "sglang", "schedule": {"active": 2, "repeat": 1},
      "sglang": {"profile_by_stage": True}}, "give discrete: true and regions [extend, decode]",
     "$.roles.rollout.sglang"),
    ({"backend": "sglang", "discrete": True, "regions": ["extend"]},
     "discrete: true needs profile_by_stage", "$.roles.rollout.discrete"),
    ({"backend": "sglang", "mesh": {"pp": 2, "tp": 2}, "sglang": {"activities": ["MEM"]}},
     "names memory snapshots by TP rank only", "$.roles.rollout.sglang"),
    ({"backend": "sglang", "sglang": {"activities": []}}, "activities is empty",
     "$.roles.rollout.sglang.activities"),
    ({"backend": "sglang", "sglang": {"output_dir": "rel"}}, "output_dir 'rel' is relative",
     "$.roles.rollout.sglang.output_dir"),
    ({"backend": "sglang", "sglang": {"profile_stages": ["prefill"]}},
     "profile_stages needs profile_by_stage", "$.roles.rollout.sglang.profile_stages"),
    ({"backend": ["vllm", "torch"]}, "vllm and torch cannot record the same capture",
     "$.roles.rollout.backend[1]"),
])
def test_refused(rollout: dict[str, Any], expected: str, path: str) -> None:
    found = [(m, p) for s, m, p in _problems(rollout) if s == "error"]
    assert any(expected in m and p == path for m, p in found), found


@pytest.mark.parametrize("rollout", [
    {},
    {"ranks": {"dp": 1}},
    {"schedule": {"skip_first": 5, "wait": 1, "warmup": 2, "active": 3, "repeat": 1}},
    {"backend": "sglang", "schedule": {"active": 4, "repeat": 1}},
    {"backend": "sglang", "discrete": True, "regions": ["extend", "decode"],
     "schedule": {"active": 4, "repeat": 1}, "sglang": {"profile_by_stage": True}},
    {"backend": "sglang", "sglang": {"activities": ["CPU", "MEM"], "output_dir": "/abs"}},
])
def test_accepted(rollout: dict[str, Any]) -> None:
    assert _errors(rollout) == []


def test_warnings_for_versions_and_a_missing_mesh() -> None:
    warned = [m for s, m, _ in _problems({"vllm": {"version": "0.10.2"}}) if s == "warning"]
    assert any("vLLM 0.10.2 is older than 0.33.0" in m for m in warned)
    warned = [m for s, m, _ in _problems({"backend": "sglang", "sglang": {"version": "0.4.9"}})
              if s == "warning"]
    assert any("ProfileReqInput" in m for m in warned)
    body = {"enabled": True, "backend": "vllm", "steps": [2]}
    result = analyze(read_source({"version": 1, "roles": {"rollout": body}}, []))
    assert any("has no mesh" in p.message for p in result.warnings)


def test_example_policy_is_valid() -> None:
    assert main(["validate", str(ROOT / "policies" / "verl_rollout_engines.yaml")]) == 0


def test_engine_args_formats(capsys: pytest.CaptureFixture[str]) -> None:
    policy = str(ROOT / "policies" / "verl_rollout_engines.yaml")
    assert main(["engine-args", policy, "--role", "rollout", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    config = data["profiler_config"]
    assert config["profiler"] == "torch" and config["torch_profiler_dir"].startswith("/")
    assert config["torch_profiler_dir"].endswith("/profiles/verl_engines/rollout/.engine")
    assert (config["warmup_iterations"], config["active_iterations"]) == (2, 16)
    assert main(["engine-args", policy]) == 0
    shell = capsys.readouterr().out
    assert "--profiler-config.torch_profiler_record_shapes=true" in shell
    assert main(["engine-args", policy, "--format", "python"]) == 0
    namespace: dict[str, Any] = {}
    exec(capsys.readouterr().out, namespace)  # the printed Python runs as is
    assert namespace["profiler_config"] == config
    assert main(["engine-args", policy, "--role", "actor"]) == 2
    assert "not an engine" in capsys.readouterr().err


def test_engine_args_sglang(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\noutput_dir: out\nroles:\n  rollout:\n    enabled: true\n"
                    "    backend: sglang\n    mesh: {tp: 2}\n    ranks: all\n"
                    "    sglang: {with_stack: false}\n")
    assert main(["engine-args", str(path), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["env"] == {"SGLANG_TORCH_PROFILER_DIR": str(tmp_path / "out/rollout/.engine"),
                           "SGLANG_PROFILE_WITH_STACK": "false",
                           "SGLANG_PROFILE_RECORD_SHAPES": "false"}
    assert main(["engine-args", str(path)]) == 0
    assert "export SGLANG_PROFILE_WITH_STACK=false" in capsys.readouterr().out


def test_engine_args_without_mesh_assumes_one_rank(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A role with no mesh and no --world: one engine rank, as validate's warning says."""
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\noutput_dir: out\nroles:\n  rollout: {enabled: true, "
                    "backend: vllm, ranks: [0], steps: [2]}\n")
    assert main(["validate", str(path)]) == 0
    assert "expects one vllm rank (tp=1)" in capsys.readouterr().out
    assert main(["engine-args", str(path), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["mesh"] == {}
    assert "role 'rollout' has no mesh: one vllm rank (tp=1) is assumed" in err
    assert main(["engine-args", str(path), "--world", "1"]) == 0
    assert "is assumed" not in capsys.readouterr().err


_VLLM_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
label = st.text(min_size=0, max_size=80)


@given(role=label, step=st.one_of(st.none(), st.integers(0, 10**9)),
       replica=st.integers(0, 4096), token=st.text(max_size=12))
def test_prefixes_are_valid_for_vllm_and_parse_back(role: str, step: int | None,
                                                    replica: int, token: str) -> None:
    prefix = files.capture_prefix(role, step, replica, token)
    assert _VLLM_PREFIX.fullmatch(prefix) and "_" not in prefix
    name = f"{prefix}_dp1_pp0_tp3_dcp0_ep4_rank7.1733100000000000000.pt.trace.json.gz"
    found = files.parse_vllm(name, prefix)
    assert found is not None and found.coords == {"dp": 1, "pp": 0, "tp": 3, "dcp": 0,
                                                  "ep": 4, "rank": 7}
    sgl = f"{prefix}-1733100000.25-TP-3-DP-1-PP-2-EP-1-DECODE.trace.json.gz"
    parsed = files.parse_sglang(sgl, prefix, "1733100000.25")
    assert parsed is not None and parsed.stage == "decode"
    assert parsed.coords == {"tp": 3, "dp": 1, "pp": 2, "ep": 1}
    assert files.parse_sglang(sgl, prefix, "1733100000.2") is None  # another capture's id


def test_other_captures_files_do_not_match() -> None:
    a = files.capture_prefix("rollout", 2, 0, "aaaa")
    b = files.capture_prefix("rollout", 2, 1, "aaaa")
    name = f"{b}_dp0_pp0_tp0_dcp0_ep0_rank0.1.pt.trace.json.gz"
    assert files.parse_vllm(name, a) is None
    assert files.parse_vllm(f"{a}_dp0_pp0_tp0_dcp0_ep0_rank0.1.pt.trace.json.tmp", a) is None
    frontend = files.parse_vllm(f"{a}_node-1_4242.async_llm.17.pt.trace.json.gz", a)
    assert frontend is not None and frontend.kind == "frontend"
