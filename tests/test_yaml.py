"""Safe YAML parsing: plain data, positions, and every refusal with its exact position."""

from __future__ import annotations

import glob
import math
import os
import subprocess
import sys
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from work_count import counted

from policy_engine.errors import PolicyError
from policy_engine.language.read import yaml_reader as _yaml
from policy_engine.language.read import yaml_shape
from policy_engine.language.read.document import MAX_DEPTH, MAX_NODES
from policy_engine.language.read.yaml_reader import parse_yaml, parse_yaml_value

Error = tuple[str, "int | None", "int | None", str]


@pytest.fixture(params=["libyaml", "pure"])
def loader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with the C loader (when built) and with the pure-Python one."""
    if request.param == "pure":
        monkeypatch.setattr(_yaml, "_LOADER", yaml.SafeLoader)
    elif not yaml.__with_libyaml__:
        pytest.skip("PyYAML built without libyaml")
    return str(request.param)


def errors(text: str) -> list[Error]:
    with pytest.raises(PolicyError) as info:
        parse_yaml(text, "p.yaml")
    out: list[Error] = []
    for problem in info.value.problems:
        assert problem.location is not None
        assert problem.location.origin == "p.yaml"
        out.append(
            (problem.message, problem.location.line, problem.location.column, problem.json_path)
        )
    return out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", 1),
        ("0x10", 16),
        ("1_000", 1000),
        ("-2.5", -2.5),
        ("true", True),
        ("False", False),
        ("on", True),  # YAML 1.1, as PyYAML reads it
        ("~", None),
        ("null", None),
        ("", None),
        ("hello", "hello"),
        ("'1'", "1"),
        ("2024-01-01", "2024-01-01"),  # implicit timestamps stay strings
        ("2024-01-01 10:00:00", "2024-01-01 10:00:00"),
        ("=", "="),
        ("<<", "<<"),
        ("!!str 12", "12"),
        ("!!int '12'", 12),
        ("!!float 1", 1.0),
        ("!!bool 'yes'", True),
        ("!!null ''", None),
        ("[1, a]", [1, "a"]),
        ("{}", {}),
    ],
)
def test_scalars_and_collections(text: str, expected: Any) -> None:
    value = parse_yaml(f"x: {text}\n", "p.yaml").data["x"]
    assert value == expected
    assert type(value) is type(expected)


def test_special_floats() -> None:
    data = parse_yaml("a: .inf\nb: -.inf\nc: .nan\n", "p.yaml").data
    assert data["a"] == math.inf and data["b"] == -math.inf and math.isnan(data["c"])


POLICY = """\
# comment
version: 1
roles:
  actor:
    ranks: [0, -1]
    steps:
      - 2
      - "3-4"
  rollout: {enabled: true, backend: nsight}
"""


def test_positions_of_values_and_keys(loader: str) -> None:
    doc = parse_yaml(POLICY, "p.yaml")
    assert doc.data == {
        "version": 1,
        "roles": {
            "actor": {"ranks": [0, -1], "steps": [2, "3-4"]},
            "rollout": {"enabled": True, "backend": "nsight"},
        },
    }
    values = {path: (loc.line, loc.column) for path, loc in doc.values.items()}
    assert values == {
        (): (2, 1),
        ("version",): (2, 10),
        ("roles",): (4, 3),
        ("roles", "actor"): (5, 5),
        ("roles", "actor", "ranks"): (5, 12),
        ("roles", "actor", "ranks", 0): (5, 13),
        ("roles", "actor", "ranks", 1): (5, 16),
        ("roles", "actor", "steps"): (7, 7),
        ("roles", "actor", "steps", 0): (7, 9),
        ("roles", "actor", "steps", 1): (8, 9),
        ("roles", "rollout"): (9, 12),
        ("roles", "rollout", "enabled"): (9, 22),
        ("roles", "rollout", "backend"): (9, 37),
    }
    keys = {path: (loc.line, loc.column) for path, loc in doc.keys.items()}
    assert keys == {
        ("version",): (2, 1),
        ("roles",): (3, 1),
        ("roles", "actor"): (4, 3),
        ("roles", "actor", "ranks"): (5, 5),
        ("roles", "actor", "steps"): (6, 5),
        ("roles", "rollout"): (9, 3),
        ("roles", "rollout", "enabled"): (9, 13),
        ("roles", "rollout", "backend"): (9, 28),
    }
    assert {loc.origin for loc in doc.values.values()} == {"p.yaml"}


def test_columns_count_characters_not_bytes() -> None:
    doc = parse_yaml("é: ü\nx: [1, 'é', 3]\n", "p.yaml")
    assert doc.values[("x", 2)].column == 13


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "roles:\n  actor:\n    steps: 1\n    ranks: [0]\n    ranks: all\n",
            [("duplicate key 'ranks' (first defined at line 4)", 5, 5, "$.roles.actor.ranks")],
        ),
        (
            "a: 1\nb: 2\na: 3\nb: 4\n",
            [
                ("duplicate key 'a' (first defined at line 1)", 3, 1, "$.a"),
                ("duplicate key 'b' (first defined at line 2)", 4, 1, "$.b"),
            ],
        ),
        ("x: {a: 1, 'a': 2}\n", [("duplicate key 'a' (first defined at line 1)", 1, 11, "$.x.a")]),
    ],
)
def test_duplicate_keys(text: str, expected: list[Error]) -> None:
    assert errors(text) == expected


@pytest.mark.parametrize(
    ("value", "tag"),
    [
        ('!!python/object/apply:os.system ["echo pwned"]', "!!python/object/apply:os.system"),
        ("!!python/name:os.system", "!!python/name:os.system"),
        ("!!python/object/new:dict {}", "!!python/object/new:dict"),
        ("!!binary aGk=", "!!binary"),
        ("!!timestamp 2024-01-01", "!!timestamp"),
        ("!!set {a: null}", "!!set"),
        ("!!omap [a: 1]", "!!omap"),
        ("!!pairs [a: 1]", "!!pairs"),
        ("!custom x", "!custom"),
        ("!<tag:example.com,2000:x> 1", "tag:example.com,2000:x"),
    ],
)
def test_tags_are_refused_never_constructed(
    value: str, tag: str, loader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def forbidden(*args: object) -> int:
        raise AssertionError("os.system was called")

    monkeypatch.setattr(os, "system", forbidden)
    assert errors(f"safe: 1\nx: {value}\n") == [(f"tags are not allowed: '{tag}'", 2, 4, "$.x")]


def test_tag_at_the_top_and_in_keys_are_refused() -> None:
    assert errors('!!python/object/apply:os.system ["echo pwned"]\n') == [
        ("tags are not allowed: '!!python/object/apply:os.system'", 1, 1, "$")
    ]
    assert errors("!!binary aGk=: 1\n") == [
        ("keys must be strings, got aGk= (a '!!binary' value)", 1, 1, "$")
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("!!int abc", "'abc' is not a valid !!int"),
        ("!!int ''", "'' is not a valid !!int"),
        ("!!float x", "'x' is not a valid !!float"),
        ("!!bool maybe", "'maybe' is not a valid !!bool"),
        ("!!str [1]", "tag '!!str' cannot be used on a list"),
        ("!!map [1]", "tag '!!map' cannot be used on a list"),
        ("!!seq a", "tag '!!seq' cannot be used on a scalar"),
    ],
)
def test_core_tags_must_fit_their_value(value: str, message: str) -> None:
    assert errors(f"x: {value}\n") == [(message, 1, 4, "$.x")]


MERGE = """\
base: &base {backend: torch, ranks: [0], torch: {gzip: true}}
extra: &extra {ranks: [1], steps: all}
roles:
  actor:
    <<: [*base, *extra]
    backend: nsight
  ref:
    <<: *base
"""


def test_merge_keys_explicit_keys_and_earlier_maps_win() -> None:
    doc = parse_yaml(MERGE, "p.yaml")
    actor = doc.data["roles"]["actor"]
    assert actor == {"backend": "nsight", "ranks": [0], "torch": {"gzip": True}, "steps": "all"}
    assert doc.data["roles"]["ref"] == {"backend": "torch", "ranks": [0], "torch": {"gzip": True}}
    # merged values point where they were written: in the anchored mapping
    ranks = doc.values[("roles", "actor", "ranks")]
    assert (ranks.line, ranks.column) == (1, 37)
    steps_key = doc.keys[("roles", "actor", "steps")]
    assert (steps_key.line, steps_key.column) == (2, 28)
    backend = doc.values[("roles", "actor", "backend")]
    assert (backend.line, backend.column) == (6, 14)


def test_nested_merges_and_unshared_copies() -> None:
    text = "a: &a {x: [1]}\nb: &b {<<: *a, y: 2}\nc: {<<: *b, z: 3}\n"
    data = parse_yaml(text, "p.yaml").data
    assert data["c"] == {"x": [1], "y": 2, "z": 3}
    data["c"]["x"].append(9)  # aliases become independent copies, safe to edit
    assert data["a"] == {"x": [1]} and data["b"]["x"] == [1]


@pytest.mark.parametrize("value", ["1", "[1, 2]", "[{a: 1}, b]"])
def test_merge_needs_mappings(value: str) -> None:
    assert errors(f"x:\n  <<: {value}\n") == [
        ("the merge key << takes a mapping or a list of mappings", 2, 7, "$.x['<<']")
    ]


def test_aliases_are_expanded() -> None:
    data = parse_yaml("a: &r [0, 1]\nb: *r\n", "p.yaml").data
    assert data == {"a": [0, 1], "b": [0, 1]}


def billion_laughs(levels: int = 9, width: int = 9) -> str:
    lines = ['l0: &l0 ["lol"' + ', "lol"' * (width - 1) + "]"]
    for level in range(1, levels + 1):
        refs = ", ".join([f"*l{level - 1}"] * width)
        lines.append(f"l{level}: &l{level} [{refs}]")
    return "\n".join(lines) + "\n"


def test_billion_laughs_is_refused_fast(loader: str) -> None:
    with counted() as lines:
        found = errors(billion_laughs())
    # Refused while counting, before any expansion: tens of thousands of lines of Python
    # at most, where building even 6,561 of its values (4 levels) runs millions.
    assert lines.count < 200_000, lines.count
    assert found == [
        (
            f"the policy holds more than {MAX_NODES} values once aliases are expanded; "
            "refusing to build it",
            6,
            5,
            "$.l5",
        )
    ]


def test_a_large_flat_document_is_refused_too() -> None:
    text = "x: [" + "1, " * MAX_NODES + "1]\n"
    assert errors(text)[0][0].startswith(f"the policy holds more than {MAX_NODES} values")


@pytest.mark.parametrize(
    ("text", "path"),
    [("a: &a [*a]\n", "$.a[0]"), ("a: &a {b: *a}\n", "$.a.b"), ("a: &a {<<: *a}\n", "$.a['<<']")],
)
def test_recursive_aliases_are_refused(text: str, path: str, loader: str) -> None:
    assert errors(text) == [("an alias refers to a node that contains it", 1, 4, path)]


def nested(levels: int) -> str:
    return "x: " + "[" * levels + "]" * levels + "\n"


def test_nesting_up_to_the_limit_is_fine() -> None:
    data: Any = parse_yaml(nested(MAX_DEPTH - 1), "p.yaml").data["x"]
    for _ in range(MAX_DEPTH - 2):
        data = data[0]
    assert data == []


def test_nesting_beyond_the_limit_is_refused() -> None:
    [(message, line, column, _path)] = errors(nested(MAX_DEPTH))
    assert (message, line, column) == (f"nesting is deeper than {MAX_DEPTH} levels", 1, 67)


DEEP_BLOCK = "x:\n" + "".join(" " * i + "- \n" for i in range(3000))


@pytest.mark.parametrize("text", ["[" * 100_000, DEEP_BLOCK])
def test_very_deep_input_is_a_clear_error(text: str, loader: str) -> None:
    [(message, _line, _column, _path)] = errors(text)
    assert message == f"nesting is deeper than {MAX_DEPTH} levels"


def test_aliases_cannot_hide_depth() -> None:
    half = MAX_DEPTH // 2 + 2
    text = f"a: &deep {nested(half)[3:]}b: " + "[" * half + "*deep" + "]" * half + "\n"
    assert errors(text)[0][0] == f"nesting is deeper than {MAX_DEPTH} levels"


def test_undefined_alias(loader: str) -> None:
    [(message, line, column, _path)] = errors("a: *nowhere\n")
    assert message.startswith("found undefined alias") and (line, column) == (1, 4)


def test_syntax_error_positions_do_not_depend_on_the_loader(loader: str) -> None:
    assert [e[1:] for e in errors("a: [1\nb: 2\n")] == [(2, 2, "$")]
    [(message, line, column, _path)] = errors("a: \x07\n")
    assert message.startswith("unacceptable character #x0007") and (line, column) == (1, 4)


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="messages are libyaml's")
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "a: [1\nb: 2\n",
            (
                "did not find expected ',' or ']' "
                "(while parsing a flow sequence started at line 1, column 4)",
                2,
                2,
            ),
        ),
        (
            "a: 'open\n",
            (
                "found unexpected end of stream (while scanning a quoted scalar started "
                "at line 1, column 4)",
                2,
                1,
            ),
        ),
        ("a:\n\tb: 1\n", ("tabs cannot indent YAML; use spaces", 2, 1)),
        ("a: 1\n---\nb: 2\n", ("a policy file holds one YAML document; found a second", 2, 1)),
        ("a: \x07\n", ("unacceptable character #x0007: control characters are not allowed", 1, 4)),
    ],
)
def test_syntax_errors_keep_their_position(text: str, expected: tuple[str, int, int]) -> None:
    [(message, line, column, path)] = errors(text)
    assert (message, line, column) == expected
    assert path == "$"


@pytest.mark.parametrize(
    ("text", "line"),
    [("", None), ("# only a comment\n\n", None), ("null\n", 1), ("---\n", 2), ("{}\n", 1)],
)
def test_empty_policies(text: str, line: int | None) -> None:
    assert errors(text) == [("the policy is empty", line, 1 if line else None, "$")]


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("- a\n- b\n", "a list"),
        ("hello\n", "a string"),
        ("1\n", "an integer"),
        ("true\n", "a boolean"),
        ("1.5\n", "a number"),
    ],
)
def test_the_top_must_be_a_mapping(text: str, kind: str) -> None:
    assert errors(text) == [(f"the policy must be a mapping, got {kind}", 1, 1, "$")]


@pytest.mark.parametrize(
    ("key", "shown"),
    [
        ("0", "0 (an integer)"),
        ("1.5", "1.5 (a number)"),
        ("true", "true (a boolean)"),
        ("~", "~ (null)"),
        ("[a]", "a list"),
        ("{a: 1}", "a mapping"),
    ],
)
def test_keys_must_be_strings(key: str, shown: str) -> None:
    assert errors(f"ok: 1\n{key}: x\n") == [(f"keys must be strings, got {shown}", 2, 1, "$")]


def test_an_empty_key_is_null() -> None:
    assert errors("ok: 1\n?\n: x\n") == [("keys must be strings, got null", 2, 2, "$")]


def test_quoted_keys_are_strings() -> None:
    assert parse_yaml("'0': a\n\"<<\": b\n", "p.yaml").data == {"0": "a", "<<": "b"}


def test_parse_yaml_value_accepts_any_shape() -> None:
    assert parse_yaml_value("[1, {a: b}]", "v").value == [1, {"a": "b"}]
    empty = parse_yaml_value("# nothing", "v")
    assert empty.value is None and () not in empty.values
    null = parse_yaml_value("~", "v")
    assert null.value is None and () in null.values


# PyYAML's emitter writes some control and line-separator characters unquoted
text = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")))
plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63) + 1, 2**63 - 1)  # a policy's integers are below 2**63
    | text
    | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(text, plain, min_size=1, max_size=5))
def test_round_trip_and_every_value_located(data: dict[str, Any]) -> None:
    doc = parse_yaml(yaml.safe_dump(data, allow_unicode=True), "p.yaml")
    assert doc.data == data

    def paths(value: Any, path: tuple[str | int, ...]) -> list[tuple[str | int, ...]]:
        items = (
            value.items()
            if isinstance(value, dict)
            else (enumerate(value) if isinstance(value, list) else ())
        )
        return [path] + [p for k, v in items for p in paths(v, (*path, k))]

    for path in paths(data, ()):
        assert doc.values[path].line is not None
        if path:
            assert isinstance(path[-1], int) or path in doc.keys


# --- limits checked before composing ----------------------------------------------------
# libyaml's composer (PyYAML's C loader) recurses once per level with no guard: PyYAML
# 6.0.3 and older die of a stack overflow on a few tens of thousands of levels.

DEEP = [
    ("[" * 60_000, 1, 65),
    ("{a: " * 20_000, 1, 257),
    ("[a: " * 20_000, 1, 129),  # a single-pair mapping inside each list
    ("- " * 30_000 + "x\n", 1, 129),
    ("? " * 20_000 + "x\n", 1, 129),
    ("".join(" " * i + "a:\n" for i in range(3000)), 65, 65),
    (DEEP_BLOCK, 65, 64),
]


@pytest.mark.parametrize(("text", "line", "column"), DEEP)
def test_deep_input_is_refused_where_the_limit_is_crossed(
    text: str, line: int, column: int, loader: str
) -> None:
    [(message, *where, _path)] = errors(text)
    assert (message, *where) == (f"nesting is deeper than {MAX_DEPTH} levels", line, column)


def test_deep_input_never_reaches_the_composer() -> None:
    """In a process of its own: a regression here is a crash, not a failed assertion."""
    script = (
        "from policy_engine.language.read.yaml_reader import parse_yaml\n"
        "from policy_engine.errors import PolicyError\n"
        "texts = ['[' * 60_000, '{a: ' * 20_000, '- ' * 30_000 + 'x', '? ' * 20_000 + 'x']\n"
        "for text in texts:\n"
        "    try:\n"
        "        parse_yaml(text, 'p.yaml')\n"
        "    except PolicyError as exc:\n"
        "        print(exc.problems[0].message)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=os.path.dirname(HERE),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [f"nesting is deeper than {MAX_DEPTH} levels"] * 4


def test_the_size_limit_points_at_the_collection_that_passes_it(loader: str) -> None:
    text = "a: 1\nx: [" + "1, " * MAX_NODES + "1]\n"
    [(message, line, column, path)] = errors(text)
    assert message.startswith(f"the policy holds more than {MAX_NODES} values")
    assert (line, column, path) == (2, 4, "$.x")


def event_depth(text: str, loader_class: type[Any]) -> int:
    """The deepest nesting the parser reaches in ``text``, up to its first error."""
    parser = loader_class(text)
    depth = deepest = 0
    try:
        while parser.check_event():
            event = parser.get_event()
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                deepest = max(deepest, depth)
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        pass
    finally:
        parser.dispose()
    return deepest


@given(st.text(alphabet="[]{}-?:,#'\"|>&*! \n\tab0", max_size=200))
def test_indicator_characters_bound_the_nesting(text: str) -> None:
    """What lets short texts skip the event walk: each level needs a character of its own."""
    bound = sum(map(text.count, yaml_shape.OPENERS))
    assert event_depth(text, yaml.SafeLoader) <= bound
    if yaml.__with_libyaml__:
        assert event_depth(text, yaml.CSafeLoader) <= bound


HERE = os.path.dirname(os.path.abspath(__file__))
POLICY_FILES = sorted(
    [
        *glob.glob(os.path.join(HERE, "..", "policies", "*.yaml")),
        *glob.glob(os.path.join(HERE, "data", "**", "*.yaml"), recursive=True),
    ]
)


@pytest.mark.parametrize("path", POLICY_FILES, ids=os.path.basename)
def test_real_policies_pass_the_walk_unchanged(path: str) -> None:
    with open(path, encoding="utf-8") as stream:
        text = stream.read()
    try:
        before = parse_yaml(text, path)
    except PolicyError as exc:  # invalid examples: the walk must not change the answer
        before_error: Any = [p.render() for p in exc.problems]
    else:
        before_error = None
    try:
        yaml_shape.walk_events(_yaml._LOADER, text, path)  # refuses nothing real
    except yaml.YAMLError:  # a syntax error, which the composer finds the same way
        assert before_error is not None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(yaml_shape, "_short_and_shallow", lambda text: False)  # always walk
        try:
            after = parse_yaml(text, path)
        except PolicyError as exc:
            assert [p.render() for p in exc.problems] == before_error
        else:
            assert before_error is None and after == before


# --- integers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "digits"),
    [
        ("9223372036854775808", 19),
        ("-9223372036854775808", 19),
        ("0x8000000000000000", 19),
        ("0b" + "1" * 64, 20),
        ("9" * 5000, 5000),  # past Python's 4300-digit limit for str -> int
        ("-0x" + "f" * 5000, 5000),
        ("1" + ":59" * 100, 201),  # base 60
        ("!!int '" + "1" * 200 + "'", 200),
        ("!!int '" + "1" * 30 + "'", 30),
    ],
)
def test_integers_of_2_63_and_more_are_refused(value: str, digits: int, loader: str) -> None:
    message = f"integer too large: {digits} digits (a policy's numbers are below 2**63)"
    assert errors(f"x: {value}\n") == [(message, 1, 4, "$.x")]


def test_integers_below_2_63_are_fine() -> None:
    text = "a: 9223372036854775807\nb: -9223372036854775807\nc: 0x7fffffffffffffff\n"
    assert parse_yaml(text, "p.yaml").data == {"a": 2**63 - 1, "b": -(2**63) + 1, "c": 2**63 - 1}


def test_long_values_are_cut_in_messages() -> None:
    [(message, *_)] = errors("x: !!int '" + "z" * 5000 + "'\n")
    assert message == f"'{'z' * 57}...' is not a valid !!int"
    [(message, *_)] = errors("ok: 1\n? " + "1" * 5000 + "\n: x\n")
    assert message == f"keys must be strings, got {'1' * 57}... (an integer)"


# --- characters -------------------------------------------------------------------------


def test_lone_surrogates_are_refused(loader: str) -> None:
    assert errors("x: a\udcff\n") == [
        ("unacceptable character #xdcff: special characters are not allowed", 1, 5, "$")
    ]


def test_surrogate_escapes_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_yaml, "_LOADER", yaml.SafeLoader)  # libyaml refuses them itself
    assert errors('x: "\\udcff"\n') == [(_yaml.LONE_SURROGATE, 1, 4, "$.x")]
