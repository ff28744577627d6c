"""What editors get from the schema: a description on every key, examples that are valid
policies, and a ``$schema`` from ``policy-engine init`` that resolves offline."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from policy_engine import load_policy
from policy_engine.cli.main import main
from policy_engine.language.schema.build import SCHEMA_NAME, schema, schema_text

SCHEMA = schema()
ROLE = SCHEMA["$defs"]["role"]["properties"]
#: Keys whose values are worth completing from examples.
ROLE_EXAMPLES = ("backend", "ranks", "steps", "schedule", "regions", "name", "mesh")
TOP_EXAMPLES = ("prefix", "output_dir", "mesh")


def described(entry: dict[str, Any]) -> str:
    """The description an editor shows for a key: its own, else that of what it refers to."""
    if entry.get("description"):
        return str(entry["description"])
    ref = entry.get("$ref", "")
    return str(SCHEMA["$defs"][ref.removeprefix("#/$defs/")].get("description", "")) \
        if ref else ""


@pytest.mark.parametrize("key", sorted(ROLE))
def test_every_role_key_is_described(key: str) -> None:
    assert described(ROLE[key]), key


@pytest.mark.parametrize("key", sorted(SCHEMA["properties"]))
def test_every_top_level_key_is_described(key: str) -> None:
    assert described(SCHEMA["properties"][key]), key


def policies_with_examples() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for key in ROLE_EXAMPLES:
        for example in ROLE[key]["examples"]:
            out.append((f"role {key}={example!r}", {
                "version": 1, "mesh": {"pp": 2, "dp": 2, "tp": 2},
                "roles": {"actor": {"enabled": True, "steps": [2], key: example}}}))
    for key in TOP_EXAMPLES:
        for example in SCHEMA["properties"][key]["examples"]:
            out.append((f"{key}={example!r}", {"version": 1, key: example}))
    return out


EXAMPLES = policies_with_examples()


@pytest.mark.parametrize(("label", "data"), EXAMPLES, ids=[label for label, _ in EXAMPLES])
def test_every_example_is_a_valid_value(label: str, data: dict[str, Any]) -> None:
    Draft202012Validator(SCHEMA).validate(data)
    load_policy(data)  # raises PolicyError on any error


def test_the_keys_worth_completing_have_examples() -> None:
    for key in ROLE_EXAMPLES:
        assert len(ROLE[key]["examples"]) >= 2, key
    # A role's mesh is the top-level mesh's form, with an empty default: the top-level one.
    assert ROLE["mesh"]["default"] == {}
    assert {k: v for k, v in ROLE["mesh"].items() if k not in ("default", "description")} == \
        {k: v for k, v in SCHEMA["properties"]["mesh"].items() if k != "description"}


# ---------------------------------------------------------------- init


def modeline_target(policy: Path) -> Path:
    first = policy.read_text(encoding="utf-8").splitlines()[0]
    match = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
    assert match, first
    assert "://" not in match[1]  # a path that resolves offline, not a URL
    return policy.parent / match[1]


def test_init_points_at_a_schema_file_beside_the_policy(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "profile_policy.yaml"
    assert main(["init", str(policy)]) == 0
    target = modeline_target(policy)
    assert target.resolve() == (tmp_path / SCHEMA_NAME).resolve()
    assert target.read_text(encoding="utf-8") == schema_text()
    # What the editor checks against accepts the starter, and so does the engine.
    Draft202012Validator(json.loads(target.read_text(encoding="utf-8"))).validate(
        yaml.safe_load(policy.read_text(encoding="utf-8")))
    capsys.readouterr()
    assert main(["validate", "--strict", "--world", "4", str(policy)]) == 0
    assert capsys.readouterr().out == f"{policy}: valid\n"


def test_init_keeps_a_different_schema_file_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["init", str(tmp_path / "a.yaml")]) == 0
    capsys.readouterr()
    assert main(["init", str(tmp_path / "b.yaml")]) == 0  # the same schema: left alone
    assert capsys.readouterr().out.splitlines()[1] == f"{tmp_path / SCHEMA_NAME} is up to date"
    stale = tmp_path / SCHEMA_NAME
    stale.write_text('{"title": "an older schema"}\n')
    assert main(["init", str(tmp_path / "c.yaml")]) == 0
    out, err = capsys.readouterr()
    assert out == f"wrote {tmp_path / 'c.yaml'}\n"
    assert err.startswith(f"policy-engine init: warning: {stale} exists and differs from this "
                          "version's schema; kept it")
    assert stale.read_text() == '{"title": "an older schema"}\n'
    assert main(["init", "--force", str(tmp_path / "c.yaml")]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith(f"replaced {stale}")
    assert stale.read_text(encoding="utf-8") == schema_text()
