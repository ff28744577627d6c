"""validate warns when the schema file a policy points editors at is not there (a policy
copied out of the repository keeps ``$schema=../schemas/...``), and says how to write it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from policy_engine.cli.main import main

ROOT = Path(__file__).resolve().parent.parent


def validate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    code = main(["validate", *args])
    return code, [line for line in capsys.readouterr().out.splitlines()
                  if ": note: ranks of " not in line]


def test_a_copied_example_says_how_to_get_its_schema_back(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp").mkdir()
    shutil.copy(ROOT / "policies" / "verl_ppo.yaml", tmp_path / "exp" / "verl_ppo.yaml")
    code, lines = validate(capsys, "exp/verl_ppo.yaml")
    assert code == 0
    assert lines == [
        "exp/verl_ppo.yaml:1:33: warning: $schema ../schemas/profile_policy.schema.json names "
        "no file (looked for schemas/profile_policy.schema.json): editors cannot check this "
        "policy as you type; write one beside the policy with `policy-engine schema > "
        "exp/profile_policy.schema.json` and point $schema at ./profile_policy.schema.json "
        "(as `policy-engine init` does) (at $)",
        "exp/verl_ppo.yaml: valid (1 warning)"]
    assert validate(capsys, "--strict", "exp/verl_ppo.yaml")[0] == 1
    # where the folder exists, the fix is the one command
    (tmp_path / "schemas").mkdir()
    code, lines = validate(capsys, "exp/verl_ppo.yaml")
    assert "write it there with `policy-engine schema > schemas/profile_policy.schema.json`" \
        in lines[0]
    # and following it silences the warning
    assert main(["schema"]) == 0
    (tmp_path / "schemas" / "profile_policy.schema.json").write_text(capsys.readouterr().out)
    assert validate(capsys, "--strict", "exp/verl_ppo.yaml") == (
        0, ["exp/verl_ppo.yaml: valid"])


def test_the_repository_examples_and_init_resolve(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert validate(capsys, "--strict", str(ROOT / "policies" / "verl_ppo.yaml"))[0] == 0
    assert main(["init", str(tmp_path)]) == 0
    capsys.readouterr()
    path = str(tmp_path / "profile_policy.yaml")
    assert validate(capsys, "--strict", path) == (0, [f"{path}: valid"])


def test_toml_lines_json_keys_and_urls(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "p.toml").write_text("#:schema ./missing.json\nversion = 1\n"
                                     "[defaults]\nenabled = true\nsteps = [2]\n")
    code, lines = validate(capsys, str(tmp_path / "p.toml"))
    assert code == 0 and lines[0].startswith(f"{tmp_path}/p.toml:1:10: warning: $schema "
                                             "./missing.json names no file")
    (tmp_path / "p.json").write_text(json.dumps({"$schema": "schemas/x.json", "version": 1,
                                                 "defaults": {"enabled": True, "steps": [2]}}))
    code, lines = validate(capsys, str(tmp_path / "p.json"))
    assert lines[0].startswith(f"{tmp_path}/p.json:1:13: warning: $schema schemas/x.json "
                               "names no file")
    assert lines[0].endswith("(at $['$schema'])")
    (tmp_path / "u.yaml").write_text(
        "# yaml-language-server: $schema=https://example.org/profile_policy.schema.json\n"
        "version: 1\ndefaults: {enabled: true, steps: [2]}\n")
    assert validate(capsys, "--strict", str(tmp_path / "u.yaml"))[0] == 0
