"""The JSON Schema: assembled from the base and the backend registry, valid Draft 2020-12,
the same as the copy in ``schemas/``, in step with the code, and its errors made readable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from policy_engine import settings as backends
from policy_engine.language.read.source import document_from_mapping, parse_document
from policy_engine.language.schema import build as schema
from policy_engine.language.values.frozen import thaw
from policy_engine.language.values.mesh import DIMS
from policy_engine.language.values.ranks import DIMENSIONS
from policy_engine.language.values.schedule import FIELDS

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_FILE = ROOT / "schemas" / schema.SCHEMA_NAME
SCHEMA = schema.schema()


def messages(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(json path, message) of each schema problem in ``data``."""
    return [(p.json_path, p.message)
            for p in schema.validate(document_from_mapping(data)).problems]


def role(**settings: Any) -> dict[str, Any]:
    return {"version": 1, "roles": {"actor": settings}}


# ---------------------------------------------------------------- the schema


def test_the_schema_file_is_the_assembled_schema() -> None:
    assert SCHEMA_FILE.read_text(encoding="utf-8") == schema.schema_text(), (
        "schemas/profile_policy.schema.json is out of date; regenerate it with "
        "`policy-engine schema > schemas/profile_policy.schema.json`")


def test_schema_is_valid_draft_2020_12() -> None:
    Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert json.loads(schema.schema_text()) == SCHEMA


def test_backend_enum_is_the_registry() -> None:
    one, several = schema.schema()["$defs"]["role"]["properties"]["backend"]["oneOf"]
    assert one["enum"] == several["items"]["enum"] == [*backends.BACKENDS, *backends.ALIASES]
    assert set(backends.ALIASES.values()) <= set(backends.BACKENDS)


def test_every_registered_backend_has_its_settings_block() -> None:
    role_props = SCHEMA["$defs"]["role"]["properties"]
    for name in backends.BACKENDS:
        assert role_props[name] == {"$ref": f"#/$defs/{name}"}
        assert SCHEMA["$defs"][name] == backends.settings_schema(name)


@pytest.mark.parametrize("where", ["role", "region", "triggers", "limits", "export",
                                   *backends.BACKENDS])
def test_every_setting_has_a_default_and_a_description(where: str) -> None:
    for key, setting in SCHEMA["$defs"][where]["properties"].items():
        if where == "role" and key in (*backends.BACKENDS, "triggers", "limits", "export"):
            continue  # a block of its own, checked on its own
        assert "default" in setting or (where == "region" and key == "schedule"), key
        assert setting.get("description"), key


def test_defaults_are_read_from_the_schema() -> None:
    defaults = schema.defaults("role")
    assert defaults["torch"]["activities"] == ("cpu", "cuda")
    assert defaults["mstx"]["aic_metrics"] is None  # torch_npu's own for the level
    assert defaults["name"] == SCHEMA["$defs"]["role"]["properties"]["name"]["default"]
    assert set(defaults) == set(SCHEMA["$defs"]["role"]["properties"])
    top = schema.defaults()
    assert (top["prefix"], top["output_dir"], top["defaults"]) == ("trace", "profiles", defaults)


def test_defaults_fit_the_schema() -> None:
    data = {"version": 1, **{k: thaw(v) for k, v in schema.defaults().items()}}
    assert messages(data) == []


def test_dimensions_match_the_code() -> None:
    assert set(SCHEMA["properties"]["mesh"]["propertyNames"]["enum"]) == set(DIMS)
    assert list(SCHEMA["$defs"]["rank_item"]["properties"]) == list(DIMENSIONS)
    assert list(SCHEMA["$defs"]["ranks"]["properties"]) == list(DIMENSIONS)


def test_schedule_fields_match_the_code() -> None:
    assert tuple(SCHEMA["$defs"]["schedule"]["properties"]) == FIELDS
    assert SCHEMA["$defs"]["schedule"]["required"] == ["active"]


# ---------------------------------------------------------------- messages


@pytest.mark.parametrize(("data", "expected"), [
    # oneOf: the alternative the value's kind picks speaks, with every one of its errors
    (role(schedule={"active": 0, "wait": -1}), [
        ("$.roles.actor.schedule.active", "active must be >= 1, got 0"),
        ("$.roles.actor.schedule.wait", "wait must be >= 0, got -1"),
    ]),
    (role(schedule={"warmup": 1}), [
        ("$.roles.actor.schedule", "missing required key 'active' "
                                   "(the steps recorded in each cycle, >= 1)"),
    ]),
    (role(schedule={"active": 1, "warmpu": 1}), [
        ("$.roles.actor.schedule.warmpu", "unknown key 'warmpu' (did you mean 'warmup'?)"),
    ]),
    (role(schedule=3), [
        ("$.roles.actor.schedule", "schedule must be a mapping or null, got an integer 3"),
    ]),
    (role(regions=[1, "ok"]), [
        ("$.roles.actor.regions[0]", "regions[0] must be a string, got an integer 1"),
    ]),
    (role(regions={"update_actor": {"enabled": "no"}}), [
        ("$.roles.actor.regions.update_actor.enabled",
         "enabled must be a boolean, got a string 'no'"),
    ]),
    (role(regions={"update_actor": 5}), [
        ("$.roles.actor.regions.update_actor",
         "region 'update_actor' must be a mapping or null, got an integer 5"),
    ]),
    (role(regions={"update_actor": {"schedule": {"active": -1}}}), [
        ("$.roles.actor.regions.update_actor.schedule.active", "active must be >= 1, got -1"),
    ]),
    (role(regions=None), [
        ("$.roles.actor.regions", "regions must be a list or a mapping, got null"),
    ]),
    (role(mstx={"export_type": 5}), [
        ("$.roles.actor.mstx.export_type",
         "export_type must be 'text', 'db' or a list, got an integer 5"),
    ]),
    (role(mstx={"export_type": []}), [
        ("$.roles.actor.mstx.export_type", "export_type must not be empty"),
    ]),
    (role(mstx={"export_type": ["db", "db"]}), [
        ("$.roles.actor.mstx.export_type", "export_type lists 'db' more than once"),
    ]),
    # kinds, with the value shown as the file writes it
    (role(enabled=None), [("$.roles.actor.enabled", "enabled must be a boolean, got null")]),
    (role(steps=2.5), [
        ("$.roles.actor.steps",
         "steps must be an integer, a string, a list or a mapping, got a number 2.5"),
    ]),
    (role(ranks=[[0, 1]]), [
        ("$.roles.actor.ranks[0]",
         "ranks[0] must be an integer, a string or a mapping, got a list [0, 1]"),
    ]),
    (role(torch={"activities": "cpu"}), [
        ("$.roles.actor.torch.activities", "activities must be a list, got a string 'cpu'"),
    ]),
    ({"version": 1, "roles": {"actor": None}}, [
        ("$.roles.actor", "role 'actor' must be a mapping, got null"),
    ]),
    ({"version": 1, "roles": []}, [("$.roles", "roles must be a mapping, got a list []")]),
    ({"version": "1"}, [("$.version", "version must be 1, got '1'")]),
    ({"version": 1, "prefix": 7}, [("$.prefix", "prefix must be a string, got an integer 7")]),
    # enum suggestions: spelling, short words, and synonyms
    (role(backend="nsight-systems"), [
        ("$.roles.actor.backend", "backend must be one of torch, mstx, nsight, memory, "
                                  "vllm, sglang, npu, nsys, "
                                  "torch_memory, got "
                                  "'nsight-systems' (did you mean 'nsight'?)"),
    ]),
    (role(backend="pytorch"), [
        ("$.roles.actor.backend", "backend must be one of torch, mstx, nsight, memory, "
                                  "vllm, sglang, npu, nsys, "
                                  "torch_memory, got "
                                  "'pytorch' (did you mean 'torch'?)"),
    ]),
    (role(ranks={"dq": 0}), [
        ("$.roles.actor.ranks.dq", "unknown key 'dq' (did you mean 'dp'?)"),
    ]),
    ({"version": 1, "mesh": {"xx": 2}}, [
        ("$.mesh.xx", "unknown mesh dimension 'xx' (expected one of pp, dp, cp, ep, tp)"),
    ]),
    ({"version": 1, "mesh": {"dp": 2.0}}, [
        ("$.mesh.dp", "dp must be an integer, got a number 2.0"),
    ]),
    (role(colour=1, enabeld=True), [
        ("$.roles.actor.colour", "unknown key 'colour'"),
        ("$.roles.actor.enabeld", "unknown key 'enabeld' (did you mean 'enabled'?)"),
    ]),
    # every message is one printable line, whatever the file's keys hold
    ({"version": 1, "mesh": {"a\nb": [False]}}, [
        ("$.mesh['a\\nb']", "unknown mesh dimension 'a\\nb' (expected one of pp, dp, cp, ep, tp)"),
        ("$.mesh['a\\nb']", "a\\nb must be an integer, got a list [false]"),
    ]),
    ({"version": 1, "roles": {"a\u200bb": {"x\x00": 1}}}, [
        ("$.roles['a\\u200bb']",
         "bad role name 'a\\u200bb': use a letter, then letters, digits, _ . + or -"),
        ("$.roles['a\\u200bb']['x\\x00']", "unknown key 'x\\x00'"),
    ]),
    # a setting whose default depends on another is null until the backend resolves it
    (role(mstx={"aic_metrics": None, "domain": None, "mstx_domain_include": None}), []),
    (role(mstx={"domain": 3}), [
        ("$.roles.actor.mstx.domain", "domain must be a string or null, got an integer 3"),
    ]),
    ({"version": 1, "colocate": [["actor"]]}, [
        ("$.colocate[0]", "colocate[0] must have at least 2 items, got 1"),
    ]),
])
def test_messages(data: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    assert messages(data) == expected


def test_unknown_keys_point_at_the_key() -> None:
    doc = parse_document("version: 1\nroles:\n  actor: {enabled: true, rnaks: 0}\n", "p.yaml",
                         "yaml")
    [problem] = schema.validate(doc).problems
    assert problem.render() == ("p.yaml:3:26: error: unknown key 'rnaks' (did you mean "
                                "'ranks'?) (at $.roles.actor.rnaks)")


def test_bad_names_point_at_the_key() -> None:
    text = "version: 1\nmesh:\n  tp: 2\n  zz: 2\nroles:\n  ok: {}\n  1st: {}\n"
    problems = schema.validate(parse_document(text, "p.yaml", "yaml")).problems
    assert [p.render() for p in problems] == [
        "p.yaml:4:3: error: unknown mesh dimension 'zz' (expected one of pp, dp, cp, ep, tp) "
        "(at $.mesh.zz)",
        "p.yaml:7:3: error: bad role name '1st': use a letter, then letters, digits, _ . + or - "
        "(at $.roles['1st'])",
    ]


def test_problems_are_ranked_structure_first_then_file_order() -> None:
    text = ("version: 1\n"
            "roles:\n"
            "  actor:\n"
            "    schedule: {active: 0}\n"
            "    backend: bad\n"
            "extra: 1\n"
            "prefix: 3\n")
    problems = schema.validate(parse_document(text, "p.yaml", "yaml")).problems
    assert [(p.location.line if p.location else None, p.json_path) for p in problems] == [
        (6, "$.extra"),
        (7, "$.prefix"),
        (5, "$.roles.actor.backend"),
        (4, "$.roles.actor.schedule.active"),
    ]


# ---------------------------------------------------------------- any input


_scalars = st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(
    ["", "all", "0-3", "x", "torch", "text", "level1"])
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(["active", "tp", "enabled", "schedule", "x", "export_type"]), inner,
    max_size=3), max_leaves=8)
_role_keys = st.sampled_from(["enabled", "backend", "ranks", "steps", "schedule", "regions",
                              "name", "torch", "mstx", "nsight", "merge_steps", "typo"])


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(_role_keys, _values, max_size=4))
def test_every_problem_is_specific(body: dict[str, Any]) -> None:
    """Whatever a role holds, no message is jsonschema's generic oneOf/anyOf text."""
    for path, message in messages({"version": 1, "roles": {"actor": body}}):
        assert "is not valid under any of the given schemas" not in message
        assert "is valid under each of" not in message
        assert path.startswith("$.roles.actor")
        assert message[0].islower() or message[0] in "'-<"
