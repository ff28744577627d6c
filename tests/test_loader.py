"""Loading policy documents: files, formats, extends, overrides, mappings, positions."""

from __future__ import annotations

import fractions
import json
import os
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from work_count import counted

from policy_engine.errors import Location, PolicyError, Problem
from policy_engine.language.read import extends, json_reader, toml_reader
from policy_engine.language.read import source as reader
from policy_engine.language.read.document import MAX_DEPTH, Document, PolicyFileError
from policy_engine.language.read.extends import load_policy_document
from policy_engine.language.read.overrides import (
    Override,
    apply_overrides,
    overrides_from_env,
    parse_override,
)
from policy_engine.language.read.source import (
    document_from_mapping,
    parse_document,
    read_document,
    read_text,
)

Where = tuple[str, "int | None", "int | None"]


def problem_of(info: pytest.ExceptionInfo[PolicyError]) -> Problem:
    [problem] = info.value.problems
    return problem


def where(problem: Problem) -> Where:
    assert problem.location is not None
    return (problem.location.origin, problem.location.line, problem.location.column)


def pos(doc: Document, path: tuple[str | int, ...], *, key: bool = False) -> Where:
    loc = doc.locate(path, key=key)
    return (loc.origin, loc.line, loc.column)


def write(folder: Path, name: str, text: str | bytes) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


# --- reading files ----------------------------------------------------------------------


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Work in tmp_path so that file names in messages are short and exact."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files ``extends`` reads, in order: bounded work, counted rather than timed."""
    read: list[str] = []
    real = extends.read_document

    def counting(name: str) -> Document:
        read.append(name)
        return real(name)

    monkeypatch.setattr(extends, "read_document", counting)
    return read


def test_missing_file_is_a_file_error(in_tmp: Path) -> None:
    with pytest.raises(PolicyFileError) as info:
        read_text("nope.yaml")
    assert problem_of(info).message == "cannot read nope.yaml: No such file or directory"
    assert where(problem_of(info)) == ("nope.yaml", None, None)


def test_directory_is_a_file_error(in_tmp: Path) -> None:
    (in_tmp / "dir.yaml").mkdir()
    with pytest.raises(PolicyFileError) as info:
        read_text("dir.yaml")
    assert problem_of(info).message == "cannot read dir.yaml: Is a directory"


def test_unreadable_file_is_a_file_error(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(*args: object, **kwargs: object) -> Any:
        raise PermissionError(13, "Permission denied")

    # patched in the module rather than chmod, which root (CI containers) ignores
    monkeypatch.setattr(reader, "open", denied, raising=False)
    with pytest.raises(PolicyFileError) as info:
        read_text("p.yaml")
    assert problem_of(info).message == "cannot read p.yaml: Permission denied"


@pytest.mark.parametrize(
    ("raw", "message", "line", "column"),
    [
        (b"a: 1\n\x00\x01", "binary file, not a policy", None, None),
        (b"\xff\xfea\x00", "UTF-16 file; save the policy as UTF-8", None, None),
        (b"a: 1\nb: 'caf\xe9'\n", "invalid UTF-8 (byte 0xe9)", 2, 8),
        (b"\xc3\xa9\xc3\xa9: \x80\n", "invalid UTF-8 (byte 0x80)", 1, 5),
    ],
)
def test_bytes_that_are_not_a_policy(
    in_tmp: Path, raw: bytes, message: str, line: int | None, column: int | None
) -> None:
    write(in_tmp, "p.yaml", raw)
    with pytest.raises(PolicyError) as info:
        read_text("p.yaml")
    assert not isinstance(info.value, PolicyFileError)
    assert (problem_of(info).message, *where(problem_of(info))) == (message, "p.yaml", line, column)


def test_bom_is_stripped(in_tmp: Path) -> None:
    write(in_tmp, "p.json", b'\xef\xbb\xbf{"version": 1}')
    assert read_text("p.json") == '{"version": 1}'
    assert read_document("p.json").data == {"version": 1}


def test_oversized_file(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "_MAX_BYTES", 8)
    write(in_tmp, "p.yaml", "version: 1\n")
    with pytest.raises(PolicyError, match="larger than 0 MiB"):
        read_text("p.yaml")


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("p.yaml", "version: 1\n"),
        ("p.yml", "version: 1\n"),
        ("P.YAML", "version: 1\n"),
        ("p.toml", "version = 1\n"),
        ("p.json", '{"version": 1}'),
    ],
)
def test_format_by_extension(in_tmp: Path, name: str, text: str) -> None:
    write(in_tmp, name, text)
    doc = read_document(name)
    assert (doc.data, doc.origin, doc.sources) == ({"version": 1}, name, (name,))
    assert pos(doc, ("version",))[1] == 1


@pytest.mark.parametrize(("name", "shown"), [("p.txt", ".txt"), ("policy", "(none)")])
def test_unsupported_extension(in_tmp: Path, name: str, shown: str) -> None:
    with pytest.raises(PolicyFileError) as info:
        read_document(name)
    assert problem_of(info).message == (
        f"unsupported extension {shown} (use .yaml, .yml, .toml or .json)"
    )
    assert where(problem_of(info)) == (name, None, None)


# --- JSON -------------------------------------------------------------------------------

JSON = """{
  "version": 1,
  "roles": {
    "actor": {"ranks": [0, -1], "enabled": true}
  }
}"""


def test_json_positions() -> None:
    doc = parse_document(JSON, "p.json", "json")
    assert doc.data == {"version": 1, "roles": {"actor": {"ranks": [0, -1], "enabled": True}}}
    assert pos(doc, ("version",)) == ("p.json", 2, 14)
    assert pos(doc, ("roles", "actor", "ranks", 1)) == ("p.json", 4, 28)
    assert pos(doc, ("roles", "actor", "enabled"), key=True) == ("p.json", 4, 33)


@pytest.mark.parametrize(
    ("text", "message", "line", "column"),
    [
        (
            '{\n  "roles": {\n    "a": 1,\n    "ranks": 2,\n    "ranks": 3\n  }\n}',
            "duplicate key 'ranks' (first defined at line 4)",
            5,
            5,
        ),
        ('{"a": 1,\n "b": [1, 2,]}', "Expecting value", 2, 13),
        ('{"a": 1}\n{"b": 2}', "Extra data", 2, 1),
        ('{"a": NaN}', "NaN is not valid JSON", 1, 7),
        ('{"a": "NaN", "b": [1, -Infinity]}', "-Infinity is not valid JSON", 1, 23),
        ("[1, 2]", "the policy must be a mapping, got a list", 1, 1),
        ("null", "the policy is empty", 1, 1),
        ("  \n", "the policy is empty", None, None),
        ("{}", "the policy is empty", 1, 1),
        ("[" * 100_000, f"nesting is deeper than {MAX_DEPTH} levels", 1, MAX_DEPTH + 1),
    ],
)
def test_json_errors(text: str, message: str, line: int | None, column: int | None) -> None:
    with pytest.raises(PolicyError) as info:
        parse_document(text, "p.json", "json")
    assert (problem_of(info).message, *where(problem_of(info))) == (message, "p.json", line, column)


def test_json_nesting_limit() -> None:
    text = '{"x": ' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}"
    with pytest.raises(PolicyError, match=f"nesting is deeper than {MAX_DEPTH} levels"):
        parse_document(text, "p.json", "json")


def test_json_that_pyyaml_cannot_position_still_loads() -> None:
    long_key = "k" * 1100  # PyYAML caps implicit keys at 1024 characters
    doc = parse_document(json.dumps({"version": 1, long_key: 2}), "p.json", "json")
    assert doc.data == {"version": 1, long_key: 2}
    assert doc.values == {} and pos(doc, ("version",)) == ("p.json", None, None)


@given(
    st.dictionaries(
        st.text(),
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers(-(2**63) + 1, 2**63 - 1)  # a policy's integers are below 2**63
            | st.text()
            | st.floats(allow_nan=False, allow_infinity=False),
            lambda inner: (
                st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3)
            ),
            max_leaves=12,
        ),
        min_size=1,
        max_size=4,
    )
)
def test_json_round_trip(data: dict[str, Any]) -> None:
    assert parse_document(json.dumps(data, indent=2), "p.json", "json").data == data


# --- TOML -------------------------------------------------------------------------------

TOML = '''\
# a policy
version = 1
prefix = "run"

[defaults]
ranks = [0]
torch.activities = ["cpu", "cuda"]
schedule = { wait = 1, active = 2 }

[roles.actor]
"odd.key" = 3
steps = [
  1,
  "fake = 2",
]
note = """
not_a_key = 1
"""
enabled = true

[[roles.actor.regions]]
name = "update"

[[roles.actor.regions]]
name = "rollout"

[roles.actor.regions.options]
depth = 2
'''


@pytest.mark.parametrize(
    ("path", "key", "line", "column"),
    [
        (("version",), False, 2, 11),
        (("version",), True, 2, 1),
        (("prefix",), False, 3, 10),
        (("defaults",), False, 5, 1),
        (("defaults",), True, 5, 2),
        (("defaults", "ranks"), False, 6, 9),
        (("defaults", "ranks", 0), False, 6, 9),  # array items fall back to the array
        (("defaults", "torch"), True, 7, 1),
        (("defaults", "torch", "activities"), False, 7, 20),
        (("defaults", "torch", "activities"), True, 7, 7),
        (("defaults", "schedule", "active"), False, 8, 12),  # inline table: its start
        (("roles",), True, 10, 2),
        (("roles", "actor"), False, 10, 1),
        (("roles", "actor"), True, 10, 8),
        (("roles", "actor", "odd.key"), True, 11, 1),
        (("roles", "actor", "odd.key"), False, 11, 13),
        (("roles", "actor", "steps"), False, 12, 9),
        (("roles", "actor", "note"), False, 16, 8),
        (("roles", "actor", "enabled"), False, 19, 11),
        (("roles", "actor", "regions"), True, 21, 15),
        (("roles", "actor", "regions", 0), False, 21, 1),
        (("roles", "actor", "regions", 0, "name"), False, 22, 8),
        (("roles", "actor", "regions", 1), False, 24, 1),
        (("roles", "actor", "regions", 1, "name"), False, 25, 8),
        (("roles", "actor", "regions", 1, "options"), False, 27, 1),
        (("roles", "actor", "regions", 1, "options", "depth"), False, 28, 9),
    ],
)
def test_toml_positions(path: tuple[str | int, ...], key: bool, line: int, column: int) -> None:
    doc = parse_document(TOML, "p.toml", "toml")
    assert pos(doc, path, key=key) == ("p.toml", line, column)


def test_toml_data_and_no_stray_keys() -> None:
    doc = parse_document(TOML, "p.toml", "toml")
    actor = doc.data["roles"]["actor"]
    assert actor["steps"] == [1, "fake = 2"] and actor["note"] == "not_a_key = 1\n"
    assert [r["name"] for r in actor["regions"]] == ["update", "rollout"]
    assert all("fake" not in p and "not_a_key" not in p for p in doc.values)


@pytest.mark.parametrize(
    ("text", "message", "line", "column"),
    [
        ("a = 1\na = 2\n", "Cannot overwrite a value", 2, 6),
        ("a = \n", "Invalid value", 1, 5),
        ('a = "open', "Unterminated string", 1, 10),
        (
            "x = 1979-05-27\n",
            "key 'x' holds a date/time; policies have none (quote it to make a string)",
            1,
            5,
        ),
        (
            "[t]\nwhen = 07:32:00\n",
            "key 't.when' holds a date/time; policies have none (quote it to make a string)",
            2,
            8,
        ),
        ("# nothing\n", "the policy is empty", None, None),
    ],
)
def test_toml_errors(text: str, message: str, line: int | None, column: int | None) -> None:
    with pytest.raises(PolicyError) as info:
        parse_document(text, "p.toml", "toml")
    assert (problem_of(info).message, *where(problem_of(info))) == (message, "p.toml", line, column)


# --- mappings and locate ----------------------------------------------------------------


class FrozenMap(Mapping[str, Any]):
    """Stands in for an OmegaConf DictConfig: a Mapping that is not a dict."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


class Items(Sequence[Any]):
    """Stands in for an OmegaConf ListConfig."""

    def __init__(self, *items: Any) -> None:
        self._items = items

    def __getitem__(self, index: Any) -> Any:
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)


def test_document_from_mapping_converts_mapping_likes() -> None:
    source = FrozenMap({"version": 1, "roles": FrozenMap({"actor": {"ranks": Items(0, (1, 2))}})})
    doc = document_from_mapping(source, "cfg")
    assert doc.data == {"version": 1, "roles": {"actor": {"ranks": [0, [1, 2]]}}}
    assert type(doc.data["roles"]) is dict and type(doc.data["roles"]["actor"]["ranks"]) is list
    assert doc.locate(["roles", "actor", "ranks", 0]) == Location("cfg")


def test_document_from_mapping_copies() -> None:
    source = {"version": 1, "steps": [1, 2]}
    doc = document_from_mapping(source)
    doc.data["steps"].append(3)
    assert source == {"version": 1, "steps": [1, 2]} and doc.origin == "<mapping>"


@pytest.mark.parametrize(
    ("data", "message", "path"),
    [
        ({"a": {1: 2}}, "keys must be strings, got 1 (an integer)", "$.a"),
        ({"a": {None: 2}}, "keys must be strings, got null", "$.a"),
        ({"a": {1, 2}}, "set values are not allowed in a policy", "$.a"),
        ({"a": b"x"}, "bytes values are not allowed in a policy", "$.a"),
        ([1], "the policy must be a mapping, got a list", "$"),
        ({}, "the policy is empty", "$"),
    ],
)
def test_document_from_mapping_refusals(data: Any, message: str, path: str) -> None:
    with pytest.raises(PolicyError) as info:
        document_from_mapping(data)
    assert (problem_of(info).message, problem_of(info).json_path) == (message, path)


def test_document_from_mapping_survives_a_cycle() -> None:
    looped: dict[str, Any] = {"version": 1}
    looped["self"] = looped
    with pytest.raises(PolicyError, match=f"nesting is deeper than {MAX_DEPTH} levels"):
        document_from_mapping(looped)


def test_locate_falls_back_to_ancestors_then_origin() -> None:
    doc = parse_document("roles:\n  actor:\n    ranks: [0]\n", "p.yaml", "yaml")
    assert pos(doc, ("roles", "actor", "ranks")) == ("p.yaml", 3, 12)
    assert pos(doc, ("roles", "actor", "ranks"), key=True) == ("p.yaml", 3, 5)
    assert pos(doc, ("roles", "actor", "ranks", 0), key=True) == ("p.yaml", 3, 13)
    assert pos(doc, ("roles", "actor", "missing")) == ("p.yaml", 3, 5)
    assert pos(doc, ("roles", "actor", "missing"), key=True) == ("p.yaml", 2, 3)
    assert pos(Document({"a": 1}, "x"), ("a",)) == ("x", None, None)


# --- extends ----------------------------------------------------------------------------


def test_extends_chain_of_three(in_tmp: Path) -> None:
    write(in_tmp, "conf/base.yaml", "version: 1\ndefaults:\n  ranks: [0]\n  torch: {gzip: true}\n")
    write(
        in_tmp,
        "conf/mid.yaml",
        "extends: base.yaml\ndefaults:\n  ranks: [1, 2]\n  torch: {with_stack: true}\n",
    )
    write(in_tmp, "top.yaml", "extends: conf/mid.yaml\nprefix: run\ndefaults:\n  ranks: [3]\n")
    doc = load_policy_document("top.yaml")
    assert doc.data == {
        "version": 1,
        "defaults": {"ranks": [3], "torch": {"gzip": True, "with_stack": True}},
        "prefix": "run",
    }
    assert doc.origin == "top.yaml"
    assert doc.sources == ("top.yaml", "conf/mid.yaml", "conf/base.yaml")
    assert pos(doc, ("version",)) == ("conf/base.yaml", 1, 10)
    assert pos(doc, ("defaults", "torch", "gzip")) == ("conf/base.yaml", 4, 17)
    assert pos(doc, ("defaults", "torch", "with_stack"), key=True) == ("conf/mid.yaml", 4, 11)
    assert pos(doc, ("defaults", "ranks")) == ("top.yaml", 4, 10)
    assert pos(doc, ("defaults", "ranks", 0)) == ("top.yaml", 4, 11)
    assert pos(doc, ("defaults",), key=True) == ("top.yaml", 3, 1)
    assert not any(path[:1] == ("extends",) for path in (*doc.values, *doc.keys))


def test_extends_list_applies_in_order(in_tmp: Path) -> None:
    write(in_tmp, "a.yaml", "version: 1\nprefix: a\nmesh: {tp: 2}\n")
    write(in_tmp, "b.json", '{"prefix": "b", "mesh": {"dp": 2}}')
    write(in_tmp, "c.toml", 'output_dir = "c"\n')
    write(in_tmp, "top.yaml", "extends: [a.yaml, b.json, c.toml]\noutput_dir: top\n")
    doc = load_policy_document("top.yaml")
    assert doc.data == {
        "version": 1,
        "prefix": "b",
        "mesh": {"tp": 2, "dp": 2},
        "output_dir": "top",
    }
    assert doc.sources == ("top.yaml", "a.yaml", "b.json", "c.toml")
    assert pos(doc, ("prefix",)) == ("b.json", 1, 12)


def test_extends_diamond_is_not_a_cycle(in_tmp: Path) -> None:
    write(in_tmp, "d.yaml", "version: 1\n")
    write(in_tmp, "b.yaml", "extends: d.yaml\nprefix: b\n")
    write(in_tmp, "c.yaml", "extends: d.yaml\noutput_dir: c\n")
    write(in_tmp, "a.yaml", "extends: [b.yaml, c.yaml]\n")
    doc = load_policy_document("a.yaml")
    assert doc.data == {"version": 1, "prefix": "b", "output_dir": "c"}
    assert doc.sources == ("a.yaml", "b.yaml", "d.yaml", "c.yaml")


@pytest.mark.parametrize(
    ("files", "message", "at"),
    [
        (
            {"a.yaml": "extends: b.yaml\n", "b.yaml": "version: 1\nextends: a.yaml\n"},
            "extends cycle: a.yaml -> b.yaml -> a.yaml",
            ("b.yaml", 2, 10),
        ),
        ({"a.yaml": "extends: [./a.yaml]\n"}, "extends cycle: a.yaml -> a.yaml", ("a.yaml", 1, 11)),
        (
            {"a.yaml": "version: 1\nextends:\n  - missing.yaml\n"},
            "cannot read missing.yaml: No such file or directory",
            ("a.yaml", 3, 5),
        ),
        (
            {"a.yaml": "extends: base.txt\n", "base.txt": "version: 1\n"},
            "unsupported extension .txt (use .yaml, .yml, .toml or .json)",
            ("a.yaml", 1, 10),
        ),
        (
            {"a.yaml": "extends: {file: b.yaml}\n"},
            "extends must be a file name or a list of file names, got a mapping",
            ("a.yaml", 1, 10),
        ),
        (
            {"a.yaml": "extends: b.yaml\n", "b.yaml": "version: 1\nversion: 2\n"},
            "duplicate key 'version' (first defined at line 1)",
            ("b.yaml", 2, 1),
        ),
    ],
)
def test_extends_errors(in_tmp: Path, files: dict[str, str], message: str, at: Where) -> None:
    for name, text in files.items():
        write(in_tmp, name, text)
    with pytest.raises(PolicyError) as info:
        load_policy_document("a.yaml")
    assert type(info.value) is PolicyError  # a missing base is the includer's mistake
    assert (problem_of(info).message, where(problem_of(info))) == (message, at)


def test_extends_cycle_is_found_fast(in_tmp: Path, reads: list[str]) -> None:
    for i in range(50):
        write(in_tmp, f"f{i}.yaml", f"extends: f{(i + 1) % 50}.yaml\n")
    with pytest.raises(
        PolicyError,
        match=r"^f49.yaml:1:10: error: extends cycle: f0.yaml -> f1.yaml -> .* -> f0.yaml ",
    ):
        load_policy_document("f0.yaml")
    assert reads == [f"f{i}.yaml" for i in range(50)]  # each file once, then the cycle


def test_missing_top_file_stays_a_file_error(in_tmp: Path) -> None:
    with pytest.raises(PolicyFileError):
        load_policy_document("nope.yaml")


# --- overrides --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "path", "value"),
    [
        ("roles.actor.ranks=all", ("roles", "actor", "ranks"), "all"),
        ("steps=[1,2]", ("steps",), [1, 2]),
        (
            "roles.actor.torch.record_shapes=true",
            ("roles", "actor", "torch", "record_shapes"),
            True,
        ),
        (" mesh = {tp: 2, dp: 4} ", ("mesh",), {"tp": 2, "dp": 4}),
        ("prefix=a=b", ("prefix",), "a=b"),
        ('prefix=""', ("prefix",), ""),
        ("prefix=2024-01-01", ("prefix",), "2024-01-01"),
        ("roles.my-role.enabled=~", ("roles", "my-role", "enabled"), None),
    ],
)
def test_parse_override(text: str, path: tuple[str, ...], value: Any) -> None:
    assert parse_override(text) == Override(path, value, Location(f"--set {text}"))


@pytest.mark.parametrize(
    ("text", "message", "json_path"),
    [
        ("x=", "override needs KEY=VALUE, got 'x='", "$"),
        ("x=  ", "override needs KEY=VALUE, got 'x=  '", "$"),
        ("x=# just a comment", "override needs KEY=VALUE, got 'x=# just a comment'", "$"),
        ("roles.actor", "override needs KEY=VALUE, got 'roles.actor'", "$"),
        ("=1", "override needs KEY=VALUE, got '=1'", "$"),
        ("a..b=1", "override key 'a..b' is not a dotted name such as roles.actor.ranks", "$"),
        ("steps.0=1", "override key 'steps.0' is not a dotted name such as roles.actor.ranks", "$"),
        ("a b=1", "override key 'a b' is not a dotted name such as roles.actor.ranks", "$"),
        ("extends=x.yaml", "extends cannot be set by an override", "$.extends"),
        (
            "x=!!python/object/apply:os.system [ls]",
            "tags are not allowed: '!!python/object/apply:os.system'",
            "$.x",
        ),
        ("x={a: 1, a: 2}", "duplicate key 'a' (first defined at line 1)", "$.x"),
    ],
)
def test_bad_overrides(text: str, message: str, json_path: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_override(text)
    problem = problem_of(info)
    assert (problem.message, problem.json_path) == (message, json_path)
    assert problem.location == Location(f"--set {text}")
    assert str(info.value) == f"--set {text}: error: {message} (at {json_path})"


def test_override_origin_label() -> None:
    override = parse_override("roles.actor.ranks=all", "--set roles.actor.ranks=all")
    assert override.location == Location("--set roles.actor.ranks=all")
    assert override.location.render() == "--set roles.actor.ranks=all"


def test_overrides_from_env() -> None:
    env = {"PROFILE_POLICY_SET": "roles.actor.ranks=all;; steps=[1, 2] ;"}
    assert overrides_from_env(env) == [
        Override(
            ("roles", "actor", "ranks"),
            "all",
            Location("PROFILE_POLICY_SET[1]: roles.actor.ranks=all"),
        ),
        Override(("steps",), [1, 2], Location("PROFILE_POLICY_SET[3]: steps=[1, 2]")),
    ]
    assert overrides_from_env({}) == []


def test_overrides_from_env_reports_every_bad_item() -> None:
    with pytest.raises(PolicyError) as info:
        overrides_from_env({"PROFILE_POLICY_SET": "a=1;b;c.=2"})
    assert [p.render() for p in info.value.problems] == [
        "PROFILE_POLICY_SET[2]: b: error: override needs KEY=VALUE, got 'b' (at $)",
        "PROFILE_POLICY_SET[3]: c.=2: error: override key 'c.' is not a dotted name such as "
        "roles.actor.ranks (at $)",
    ]


def test_overrides_from_env_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROFILE_POLICY_SET", "prefix=x")
    assert [o.value for o in overrides_from_env()] == ["x"]


BASE = """\
version: 1
roles:
  actor:
    ranks: [0, 1]
    torch: {record_shapes: false}
  ref:
"""


def test_apply_overrides_sets_values_and_positions() -> None:
    doc = parse_document(BASE, "p.yaml", "yaml")
    overrides = [
        parse_override("roles.actor.ranks={tp: 0}"),
        parse_override("roles.ref.enabled=true"),
        parse_override("roles.critic.torch.gzip=false", "PROFILE_POLICY_SET[1]: x"),
    ]
    new = apply_overrides(doc, overrides)
    assert new.data == {
        "version": 1,
        "roles": {
            "actor": {"ranks": {"tp": 0}, "torch": {"record_shapes": False}},
            "ref": {"enabled": True},
            "critic": {"torch": {"gzip": False}},
        },
    }
    assert doc.data["roles"]["actor"]["ranks"] == [0, 1]  # the input is left alone
    ranks = Location("--set roles.actor.ranks={tp: 0}")
    assert new.locate(("roles", "actor", "ranks")) == ranks
    assert new.locate(("roles", "actor", "ranks", "tp"), key=True) == ranks
    assert ("roles", "actor", "ranks", 0) not in new.values  # stale positions dropped
    assert pos(new, ("roles", "actor", "torch")) == ("p.yaml", 5, 12)
    assert new.locate(("roles", "ref")) == Location("--set roles.ref.enabled=true")
    assert pos(new, ("roles", "ref"), key=True) == ("p.yaml", 6, 3)  # the key is still there
    env = Location("PROFILE_POLICY_SET[1]: x")
    assert new.locate(("roles", "critic")) == env
    assert new.locate(("roles", "critic", "torch", "gzip"), key=True) == env


def test_apply_overrides_later_wins_and_keeps_document_fields() -> None:
    doc = attrs.evolve(parse_document(BASE, "p.yaml", "yaml"), sources=("p.yaml",))
    new = apply_overrides(doc, [parse_override("version=2"), parse_override("version=3")])
    assert new.data["version"] == 3 and new.sources == ("p.yaml",) and new.origin == "p.yaml"
    assert apply_overrides(doc, []) is doc


def test_apply_overrides_refuses_to_go_through_a_non_mapping() -> None:
    doc = parse_document(BASE, "p.yaml", "yaml")
    overrides = [parse_override("version.major=1"), parse_override("roles.actor.ranks.tp=0")]
    with pytest.raises(PolicyError) as info:
        apply_overrides(doc, overrides)
    assert [p.render() for p in info.value.problems] == [
        "--set version.major=1: error: cannot set version.major: version is an integer, "
        "not a mapping (at $.version)",
        "--set roles.actor.ranks.tp=0: error: cannot set roles.actor.ranks.tp: "
        "roles.actor.ranks is a list, not a mapping (at $.roles.actor.ranks)",
    ]


def test_load_policy_document_applies_overrides_after_extends(in_tmp: Path) -> None:
    write(in_tmp, "base.yaml", "version: 1\nprefix: base\n")
    write(in_tmp, "top.yaml", "extends: base.yaml\nprefix: top\n")
    doc = load_policy_document("top.yaml", [parse_override("prefix=cli")])
    assert doc.data == {"version": 1, "prefix": "cli"}
    assert doc.locate(("prefix",)) == Location("--set prefix=cli")
    assert pos(doc, ("version",)) == ("base.yaml", 1, 10)


# --- what is not a regular file -----------------------------------------------------------


def read_in_thread(name: str) -> BaseException | str:
    """read_text(name) with a time limit: a read that blocks fails the test, not hangs it."""
    result: list[BaseException | str] = []

    def read() -> None:
        try:
            result.append(read_text(name))
        except BaseException as exc:  # handed to the test
            result.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(10)
    assert result, f"reading {name} blocked"
    return result[0]


def test_a_named_pipe_is_refused_without_waiting(in_tmp: Path) -> None:
    os.mkfifo("p.yaml")
    error = read_in_thread("p.yaml")
    assert isinstance(error, PolicyFileError)
    [problem] = error.problems
    assert (problem.message, *where(problem)) == (
        "not a regular file: p.yaml (a named pipe)", "p.yaml", None, None
    )


def test_a_socket_and_a_device_are_refused(in_tmp: Path) -> None:
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("s.yaml")
        error = read_in_thread("s.yaml")
    assert isinstance(error, PolicyFileError)
    assert error.problems[0].message == "not a regular file: s.yaml (a socket)"
    os.symlink(os.devnull, "d.yaml")
    error = read_in_thread("d.yaml")
    assert isinstance(error, PolicyFileError)
    assert error.problems[0].message == "not a regular file: d.yaml (a character device)"


def test_a_name_the_system_refuses_is_a_file_error() -> None:
    with pytest.raises(PolicyFileError) as info:
        read_text("a\0.yaml")
    assert problem_of(info).message == "cannot read 'a\\x00.yaml': embedded null byte"


def test_extends_naming_a_pipe_points_at_the_includer(in_tmp: Path) -> None:
    os.mkfifo("base.yaml")
    write(in_tmp, "top.yaml", "version: 1\nextends: base.yaml\n")
    with pytest.raises(PolicyError) as info:
        load_policy_document("top.yaml")
    assert type(info.value) is PolicyError
    assert (problem_of(info).message, where(problem_of(info))) == (
        "not a regular file: base.yaml (a named pipe)", ("top.yaml", 2, 10)
    )


def test_extends_naming_a_nul_points_at_the_includer(in_tmp: Path) -> None:
    write(in_tmp, "top.yaml", 'version: 1\nextends: "a\\0.yaml"\n')
    with pytest.raises(PolicyError) as info:
        load_policy_document("top.yaml")
    assert (problem_of(info).message, where(problem_of(info))) == (
        "cannot read 'a\\x00.yaml': embedded null byte", ("top.yaml", 2, 10)
    )


# --- extends limits ---------------------------------------------------------------------


def test_a_long_extends_chain_stops_at_the_limit(in_tmp: Path, reads: list[str]) -> None:
    for i in range(1000):
        write(in_tmp, f"c{i}.yaml", f"extends: c{i + 1}.yaml\n" if i < 999 else "version: 1\n")
    with pytest.raises(PolicyError) as info:
        load_policy_document("c0.yaml")
    assert len(reads) == extends.MAX_EXTENDS_DEPTH  # not the 1000 files of the chain
    last = extends.MAX_EXTENDS_DEPTH - 1
    assert (problem_of(info).message, where(problem_of(info))) == (
        f"extends chain is longer than {extends.MAX_EXTENDS_DEPTH} files: "
        f"c0.yaml -> c1.yaml -> ... -> c{last}.yaml -> c{last + 1}.yaml",
        (f"c{last}.yaml", 1, 10),
    )


def test_a_chain_at_the_limit_loads(in_tmp: Path) -> None:
    depth = extends.MAX_EXTENDS_DEPTH
    for i in range(depth):
        text = f"extends: c{i + 1}.yaml\n" if i < depth - 1 else "version: 1\n"
        write(in_tmp, f"c{i}.yaml", text)
    assert load_policy_document("c0.yaml").data == {"version": 1}


def test_extends_may_read_only_so_many_files(in_tmp: Path) -> None:
    write(in_tmp, "base.yaml", "prefix: x\n")
    names = ", ".join(["base.yaml"] * 1000)
    write(in_tmp, "top.yaml", f"version: 1\nextends: [{names}]\n")
    with pytest.raises(PolicyError) as info:
        load_policy_document("top.yaml")
    limit = extends.MAX_EXTENDS_FILES
    problem = problem_of(info)
    assert problem.message == f"extends reads more than {limit} files in all"
    assert (problem.json_path, where(problem)) == (
        f"$.extends[{limit - 1}]", ("top.yaml", 2, 11 + 11 * (limit - 1))
    )


def test_a_diamond_that_fans_out_is_bounded(in_tmp: Path, reads: list[str]) -> None:
    write(in_tmp, "d20.yaml", "version: 1\n")
    for i in range(20):  # 2**20 reads without a limit
        write(in_tmp, f"d{i}.yaml", f"extends: [d{i + 1}.yaml, d{i + 1}.yaml]\n")
    with pytest.raises(PolicyError, match="extends reads more than"):
        load_policy_document("d0.yaml")
    assert len(reads) == extends.MAX_EXTENDS_FILES


# --- numbers, nesting and size in JSON and TOML ---------------------------------------------


def _unreachable(name: str, module: Any) -> SimpleNamespace:
    """``module`` (json or tomllib) whose ``loads`` fails the test if it is called."""
    def loads(*args: Any, **kwargs: Any) -> NoReturn:
        raise AssertionError(f"{name}.loads was called: the text was not refused before it")
    errors = {k: v for k, v in vars(module).items() if k.endswith("Error")}
    return SimpleNamespace(loads=loads, **errors)

TOO_LARGE = "integer too large: {} digits (a policy's numbers are below 2**63)"
LONE_SURROGATE = "a lone surrogate (\\ud800-\\udfff) is not a character; write UTF-8 text"


@pytest.mark.parametrize(
    ("text", "digits", "line", "column", "path"),
    [
        ('{"a": 9223372036854775807,\n "b": 9223372036854775808}', 19, 2, 7, "$.b"),
        ('{"a": [1, -9223372036854775808]}', 19, 1, 11, "$.a[1]"),
        ('{"a": "1", "b": ' + "9" * 5000 + "}", 5000, 1, 17, "$.b"),
    ],
)
def test_json_integers_of_2_63_and_more(
    text: str, digits: int, line: int, column: int, path: str
) -> None:
    with pytest.raises(PolicyError) as info:
        parse_document(text, "p.json", "json")
    problem = problem_of(info)
    assert (problem.message, *where(problem), problem.json_path) == (
        TOO_LARGE.format(digits), "p.json", line, column, path
    )


def test_json_integers_are_located_even_where_yaml_cannot_read() -> None:
    text = '{"' + "k" * 1100 + '": 1, "b": 99999999999999999999}'
    with pytest.raises(PolicyError) as info:
        parse_document(text, "p.json", "json")
    assert (problem_of(info).message, *where(problem_of(info))) == (
        TOO_LARGE.format(20), "p.json", 1, 1114
    )


@pytest.mark.parametrize(
    ("text", "digits", "line", "column", "path"),
    [
        ("a = 9223372036854775807\nb = 9223372036854775808\n", 19, 2, 5, "$.b"),
        ("[t]\na = [1, -9223372036854775808]\n", 19, 2, 9, "$.t.a"),
        ("a = { b = 0x8000_0000_0000_0000 }\n", 19, 1, 11, "$.a"),
        ("a = 1\nb = " + "9" * 5000 + "\n", 5000, 2, 5, "$.b"),
        ("a = 0b" + "1" * 200 + "\n", 200, 1, 5, "$.a"),
    ],
)
def test_toml_integers_of_2_63_and_more(
    text: str, digits: int, line: int, column: int, path: str
) -> None:
    with pytest.raises(PolicyError) as info:
        parse_document(text, "p.toml", "toml")
    problem = problem_of(info)
    assert (problem.message, *where(problem), problem.json_path) == (
        TOO_LARGE.format(digits), "p.toml", line, column, path
    )


def test_toml_numbers_below_the_limit_and_look_alikes_pass() -> None:
    text = 'a = 1.5e300\nb = "99999999999999999999"\nc = -9_223_372_036_854_775_807\n'
    doc = parse_document(text, "p.toml", "toml")
    assert doc.data == {"a": 1.5e300, "b": "99999999999999999999", "c": -(2**63) + 1}


@pytest.mark.parametrize(
    ("text", "line", "column", "path"),
    [
        ("a" + ".a" * 200_000 + " = 1\n", 1, 127, "$" + ".a" * MAX_DEPTH),
        ("[a" + ".a" * 200_000 + "]\n", 1, 128, "$" + ".a" * MAX_DEPTH),
        ("x = {a" + ".a" * 200_000 + " = 1}\n", 1, 130, "$.x" + ".a" * (MAX_DEPTH - 1)),
        ("a = " + "[" * 60_000 + "\n", 1, 4 + MAX_DEPTH, "$.a"),
        ("[t]\na = " + "[{b = " * 10_000 + "\n", 2, 5 + 6 * 31, "$.t.a"),  # 63rd bracket
        ("[[a]]\n" * 3 + "[a" + ".b" * 70 + "]\n", 4, 2 + 2 * 62, "$.a[2]" + ".b" * 62),
    ],
)
def test_deep_toml_is_refused_before_tomllib(text: str, line: int, column: int, path: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # tomllib takes minutes on such keys: the scanner must refuse them before it is called,
    # having run a few thousand lines of Python, not a line per character
    monkeypatch.setattr(toml_reader, "tomllib", _unreachable("tomllib", toml_reader.tomllib))
    with counted() as lines, pytest.raises(PolicyError) as info:
        parse_document(text, "p.toml", "toml")
    assert lines.count < 20_000, lines.count
    problem = problem_of(info)
    assert (problem.message, *where(problem), problem.json_path) == (
        f"nesting is deeper than {MAX_DEPTH} levels", "p.toml", line, column, path
    )


def test_toml_with_too_many_values() -> None:
    text = "a = [" + "1, " * 200_000 + "1]\n"
    with pytest.raises(PolicyError) as info:
        parse_document(text, "p.toml", "toml")
    assert problem_of(info).message.startswith("the policy holds more than 100000 values")
    assert where(problem_of(info))[1] == 1


def test_json_with_too_many_values_is_refused_early(monkeypatch: pytest.MonkeyPatch) -> None:
    text = '{"a": [' + "1, " * 2_000_000 + "1]}"
    # refused by the shape check, which stops counting at the limit, before json builds it
    monkeypatch.setattr(json_reader, "json", _unreachable("json", json_reader.json))
    with pytest.raises(PolicyError) as info:
        parse_document(text, "p.json", "json")
    problem = problem_of(info)
    assert problem.message.startswith("the policy holds more than 100000 values")
    assert (*where(problem), problem.json_path) == ("p.json", 1, 7, "$.a")


@pytest.mark.parametrize(
    ("data", "message", "path"),
    [
        ({"a": [1, 2**63]}, TOO_LARGE.format(19), "$.a[1]"),
        ({"a": -(10**5000)}, TOO_LARGE.format(5001), "$.a"),
        ({"a": 1 << 100_000}, TOO_LARGE.format(30104), "$.a"),  # about: too long to write out
        ({"a": "x\udcff"}, LONE_SURROGATE, "$.a"),
        ({"a": {"\ud800": 1}}, LONE_SURROGATE, "$.a"),
        ({"a": fractions.Fraction(10**400)}, "Fraction value out of a float's range", "$.a"),
    ],
)
def test_mappings_follow_the_same_rules(data: Any, message: str, path: str) -> None:
    with pytest.raises(PolicyError) as info:
        document_from_mapping(data)
    assert (problem_of(info).message, problem_of(info).json_path) == (message, path)


# --- overrides ----------------------------------------------------------------------------


def test_override_keys_and_values_nest_only_so_deep() -> None:
    key = ".".join(["a"] * (MAX_DEPTH + 1))
    with pytest.raises(PolicyError, match=f"nesting is deeper than {MAX_DEPTH} levels"):
        parse_override(f"{key}=1")
    parse_override(".".join(["a"] * MAX_DEPTH) + "=1")  # 63 mappings and a value: fine
    half = MAX_DEPTH // 2
    parse_override(".".join(["a"] * half) + "=" + "[" * half + "]" * half)
    with pytest.raises(PolicyError) as info:
        parse_override(".".join(["a"] * half) + "=" + "[" * (half + 1) + "]" * (half + 1))
    assert problem_of(info).message == f"nesting is deeper than {MAX_DEPTH} levels"


def test_override_labels_are_printable() -> None:
    with pytest.raises(PolicyError) as info:
        parse_override("prefix=\x1e\udcff")
    assert problem_of(info).location == Location("--set prefix=\\x1e\\udcff")
    with pytest.raises(PolicyError) as info:
        overrides_from_env({"PROFILE_POLICY_SET": "x=" + "[" * 100_000})
    label = problem_of(info).location.origin  # type: ignore[union-attr]
    assert label == "PROFILE_POLICY_SET[1]: x=" + "[" * 172 + "..."
    assert problem_of(info).message == f"nesting is deeper than {MAX_DEPTH} levels"


def test_override_integers_are_bounded() -> None:
    with pytest.raises(PolicyError) as info:
        parse_override("mesh.tp=" + "9" * 5000)
    assert (problem_of(info).message, problem_of(info).json_path) == (
        TOO_LARGE.format(5000), "$.mesh.tp"
    )


def test_many_overrides_apply_in_linear_time() -> None:
    """Twice the overrides, twice the work: the lines of Python run are counted (the same
    on any machine), for n and 2n overrides that each replace a value an earlier one set."""
    doc = parse_document(BASE, "p.yaml", "yaml")
    work = {}
    for n in (1000, 2000):
        overrides = [parse_override(f"k{i}.v=[{i}, {i}]") for i in range(n)]
        overrides += [parse_override(f"k{i}.v=1") for i in range(n)]
        with counted() as lines:
            new = apply_overrides(doc, overrides)
        work[n] = lines.count
    assert work[2000] < 2.2 * work[1000], work  # quadratic work would be 4 times
    assert new.data["k7"] == {"v": 1} and ("k7", "v", 0) not in new.values
