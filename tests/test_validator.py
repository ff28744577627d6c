"""The schema validator: the subset of JSON Schema it checks, what it refuses to build, and
that it finds a problem exactly where jsonschema (a test dependency only) finds one."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator, validators

from policy_engine.language.read.source import read_document
from policy_engine.language.schema import build as schema
from policy_engine.language.schema.validator import SchemaError, Validator, equal, unique

ROOT = Path(__file__).resolve().parent.parent


def errors(schema_: dict[str, Any], value: Any) -> list[tuple[str, tuple[str | int, ...]]]:
    return [(e.keyword, e.path) for e in Validator(schema_).errors(value)]


# ---------------------------------------------------------------- building


@pytest.mark.parametrize(("schema_", "message"), [
    ({"type": "array", "maxItems": 3}, "keywords this validator does not check: maxItems"),
    ({"properties": {"a": {"format": "uri"}}}, "#/properties/a: keywords this validator"),
    ({"type": "strnig"}, "unknown type"),
    ({"$ref": "#/definitions/x"}, "is not one of #/$defs/<name>"),
    ({"$ref": "#/$defs/missing", "$defs": {}}, "is not one of #/$defs/<name>"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "takes integer like an earlier"),
    ({"anyOf": [{"minimum": 1}, {"type": "null"}]}, "takes null like an earlier"),
    ({"oneOf": [{"enum": ["a"]}, {"type": "string"}]}, "takes string like an earlier"),
])
def test_building_refuses_what_it_cannot_check(schema_: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaError, match=message.replace("$", r"\$")):
        Validator(schema_)


def test_the_policy_schema_builds() -> None:
    Validator(schema.schema())


# ---------------------------------------------------------------- keywords


def test_an_integer_is_an_int() -> None:
    assert errors({"type": "integer"}, 2.0) == [("type", ())]
    assert errors({"type": "integer"}, True) == [("type", ())]
    assert errors({"type": "number"}, 2) == []
    assert errors({"type": "integer", "minimum": 1}, 0.5) == [("type", ()), ("minimum", ())]


def test_equality_is_json_equality() -> None:
    assert equal(1, 1.0) and not equal(True, 1) and not equal(False, 0)
    assert equal([1, {"a": 2}], [1.0, {"a": 2.0}]) and not equal({"a": 1}, {"a": 1, "b": 2})
    assert unique([1, True]) and not unique([1, 1.0]) and not unique([{"a": 1}, {"a": 1}])
    assert errors({"const": 1}, 1.0) == [] and errors({"const": 1}, True) == [("const", ())]
    assert errors({"enum": [0]}, False) == [("enum", ())]


def test_keys_and_alternatives() -> None:
    names = {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}
    found = Validator(names).errors({"ok": 1, "Bad": 2})
    assert [(e.keyword, e.path, e.value, e.key) for e in found] == [("pattern", (), "Bad", True)]
    either = {"oneOf": [{"type": "string", "minLength": 1}, {"type": "array"}]}
    assert errors(either, "") == [("minLength", ())]  # the value's kind picks the string
    assert errors(either, 3) == [("oneOf", ())]  # no alternative takes an integer
    assert errors({"required": ["a", "b"]}, {}) == [("required", ()), ("required", ())]


def test_errors_come_in_the_schemas_keyword_order() -> None:
    root = {"type": "object", "required": ["v"], "additionalProperties": False,
            "properties": {"x": {"type": "string"}}}
    assert errors(root, {"x": 1, "y": 2}) == [
        ("required", ()), ("additionalProperties", ()), ("type", ("x",))]


# ---------------------------------------------------------------- against jsonschema


def _reference() -> Any:
    """jsonschema's Draft 2020-12 with the same rule: an integer is an int."""
    checker = Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool))
    return validators.extend(Draft202012Validator, type_checker=checker)(schema.schema())


REFERENCE = _reference()
OURS = Validator(schema.schema())

# Valid policies: a rich one (every backend, region mappings, colocation) and the examples.
RICH: dict[str, Any] = {
    "$schema": "x", "version": 1, "extends": ["base.yaml"], "prefix": "p", "output_dir": "out",
    "mesh": {"pp": 2, "dp": 2, "tp": 2},
    "defaults": {"enabled": False, "backend": "torch", "ranks": [0, {"tp": "0-1"}],
                 "steps": [2, "4-6", "10-30:10"], "merge_steps": False,
                 "schedule": {"skip_first": 0, "skip_first_wait": True, "wait": 0, "warmup": 1,
                              "active": 2, "repeat": 1},
                 "torch": {"activities": ["cpu", "cuda"], "record_shapes": False, "gzip": True},
                 "name": "<prefix>_<role>[_<region>][_step<step>]_rank<rank>-of-<world>",
                 "on_error": "warn"},
    "roles": {
        "actor": {"enabled": True, "ranks": {"tp": 0, "dp": [0, -1]},
                  "regions": ["update_actor", "compute"]},
        "rollout": {"enabled": True, "backend": "nsight", "steps": "all",
                    "nsight": {"ranges": True, "capture": "nvtx", "capture_range_end": "auto",
                               "domain": "d", "options": {"trace": "cuda,nvtx", "t": "x",
                                                          "delay": 3, "f": True}}},
        "npu": {"enabled": True, "backend": "npu",
                "mstx": {"level": "level1", "activities": ["npu"], "export_type": ["text", "db"],
                         "aic_metrics": "memory", "domain": None, "l2_cache": False,
                         "mstx_domain_include": ["a"], "mstx_domain_exclude": None}},
        "critic": {"discrete": True, "schedule": None,
                   "regions": {"a": {"enabled": True, "schedule": {"active": 1}}, "b": None,
                               "c": {"schedule": None}}},
        "ref": {},
    },
    "colocate": [["actor", "ref"]],
}
EXAMPLES = [read_document(path).data for path in sorted((ROOT / "policies").glob("*.yaml"))]
ODD = [None, True, False, 0, 1, -1, 7, -5, 2.0, 0.5, 10**18, "", "all", "0-3", "x", "torch", "npu",
       "gpu", "text", "db", "csv", "level0", "level3", "<role>", "1st", "a b", "a\nb", "tq",
       "update_actor", "active", "nvtx", "auto", "warn", "none", "é"]
KEYS = ["active", "wait", "tp", "dp", "enabled", "schedule", "activities", "ranks", "steps",
        "rnaks", "x", "capture", "options", "trace", "domain", "backend", "name", "regions",
        "torch", "mstx", "nsight", "version", "mesh", "roles", "zz", "a\nb", "1st", "-", ""]
values = st.recursive(
    st.sampled_from(ODD),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(KEYS), inner, max_size=3),
    max_leaves=6)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()
    for key, item in items:
        yield from _paths(item, (*path, key))


@st.composite
def documents(draw: st.DrawFn) -> Any:
    """A valid policy with a few random mutations: wrong kinds, unknown keys, bad names and
    enum values, negative numbers, empty lists and mappings, keys gone."""
    doc = copy.deepcopy(draw(st.sampled_from([RICH, *EXAMPLES])))
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(list(_paths(doc))))
        if not path:
            continue
        parent: Any = doc
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "replace", "delete", "add", "empty"]))
        if action == "replace":
            parent[path[-1]] = draw(values)
        elif action == "empty":
            parent[path[-1]] = draw(st.sampled_from([[], {}, "", -1, 0]))
        elif isinstance(parent, dict) and action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(KEYS))] = draw(values)
        else:
            parent.append(draw(values))
    return doc


def _reference_paths(errors: Any) -> Iterator[tuple[Any, ...]]:
    for error in errors:
        yield tuple(error.absolute_path)
        yield from _reference_paths(error.context or ())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents())
def test_a_problem_exactly_where_jsonschema_finds_one(doc: Any) -> None:
    ours = OURS.errors(doc)
    theirs = list(REFERENCE.iter_errors(doc))
    assert bool(ours) == bool(theirs)
    # Each of our errors is at a value jsonschema also faults (in a oneOf, within its
    # alternatives), and each error jsonschema reports outside a oneOf is one of ours.
    assert {e.path for e in ours} <= set(_reference_paths(theirs))
    assert {tuple(e.absolute_path) for e in theirs if e.validator not in ("oneOf", "anyOf")} \
        <= {e.path for e in ours}
