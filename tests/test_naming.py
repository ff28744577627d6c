"""Trace name templates: grammar, rendering, sanitizing, path safety, 255-byte components."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_engine.files.layout import MAX_COMPONENT_BYTES
from policy_engine.language.schema import build as schema
from policy_engine.language.values.naming import (
    EMPTY_NAME,
    FIELDS,
    LATE_FIELDS,
    NameTemplate,
    TemplateError,
    sanitize,
)

#: The name template a role gets when the policy gives none (the schema's default).
DEFAULT_TEMPLATE: str = schema.defaults("role")["name"]
FULL = {"prefix": "ppo-qwen7b", "role": "actor", "region": "update_actor", "step": 3, "rank": 5,
        "world": 8, "tp": 1, "pp": 1, "dp": 0, "pid": 4242, "timestamp": "20250101120000123"}


def render(template: str, **values: object) -> str:
    return NameTemplate.parse(template).render(values)


# ---------------------------------------------------------------- grammar


@pytest.mark.parametrize(("template", "message", "offset"), [
    ("<role>_<>", "empty field <>", 7),
    ("<role", "unclosed '<'", 0),
    ("a_<role>>", "unexpected '>'", 8),
    ("<role>[_<step>", "unclosed '['", 6),
    ("<role>]", "unexpected ']'", 6),
    ("<role>[_[<step>]]", "optional groups cannot nest", 8),
    ("<role>[_step]", "optional group [...] holds no field", 6),
    ("<role>_<setp>", "unknown field <setp> (did you mean <step>?)", 7),
    ("<rank>_<colour>", "unknown field <colour> (fields: prefix, role, region, step, cycle, "
                        "rank, world, local_rank, node, host, pid, timestamp, backend, tp, pp, "
                        "dp, cp, ep, env:NAME)", 7),
    ("<env:>", "bad field <env:>: expected <env:NAME> with NAME a variable name", 0),
    ("<env:1X>", "bad field <env:1X>: expected <env:NAME> with NAME a variable name", 0),
    ("<role> <rank>", "character ' ' is not allowed (use letters, digits, . _ = + - or /)", 6),
    ("<role>:<rank>", "character ':' is not allowed (use letters, digits, . _ = + - or /)", 6),
    ("<role>\\<rank>", "character '\\\\' is not allowed (use letters, digits, . _ = + - or /)",
     6),
    ("<role>_ü", "character 'ü' is not allowed (use letters, digits, . _ = + - or /)", 7),
    ("/tmp/<role>", "absolute path: a name is relative to output_dir", 0),
    ("<role>/", "a name cannot end with '/'", 6),
    ("<role>//<rank>", "empty path component '//'", 7),
    ("../<role>", "'..' cannot be a path component (names stay under output_dir)", 0),
    ("<role>/../<rank>", "'..' cannot be a path component (names stay under output_dir)", 7),
    ("./<role>", "'.' cannot be a path component (names stay under output_dir)", 0),
])
def test_grammar_errors(template: str, message: str, offset: int) -> None:
    with pytest.raises(TemplateError) as info:
        NameTemplate.parse(template)
    assert (info.value.message, info.value.offset) == (message, offset)
    assert str(info.value) == message


@pytest.mark.parametrize("template", [
    DEFAULT_TEMPLATE,
    "<role>",
    "traces/<role>/rank<rank>[/step<step>]",
    "<prefix>..<role>_<rank>",  # dots inside a component are fine
    "a=b+c-d.e_<env:SLURM_JOB_ID>[_<host>]",
    "[<tp><pp>]_<rank>",
])
def test_grammar_accepts(template: str) -> None:
    assert NameTemplate.parse(template).text == template


def test_fields() -> None:
    assert NameTemplate.parse(DEFAULT_TEMPLATE).fields() == {
        "prefix", "role", "region", "step", "cycle", "rank", "world", "tp", "pp", "dp", "cp", "ep",
        "pid", "timestamp"}
    assert NameTemplate.parse("<env:USER>/x").fields() == {"env:USER"}


# ---------------------------------------------------------------- rendering


def test_default_template_makes_a_folder_per_capture_window() -> None:
    assert render(DEFAULT_TEMPLATE, **FULL) == (
        "actor/update-actor/step3/ppo-qwen7b_rank5-of-8_tp1pp1dp0_pid4242_20250101120000123")
    assert render(DEFAULT_TEMPLATE, **FULL, cycle=2) == (
        "actor/update-actor/step3/cycle2/ppo-qwen7b_rank5-of-8_tp1pp1dp0_pid4242_"
        "20250101120000123")


def test_optional_groups_vanish_when_every_field_is_empty() -> None:
    values = {k: v for k, v in FULL.items() if k not in ("region", "step", "tp", "pp", "dp")}
    assert render(DEFAULT_TEMPLATE, **values) == (
        "actor/ppo-qwen7b_rank5-of-8_pid4242_20250101120000123")
    # One known field keeps the whole group, its literal text included.
    assert render("<role>[_x<tp>y<pp>]", role="a", pp=0) == "a_xypp0"
    assert render("<role>[_step<step>]", role="a", step="") == "a"
    assert render("<role>[_step<step>]", role="a", step=0) == "a_step0"


def test_coordinates_render_with_their_label() -> None:
    assert render("<tp><pp>", tp=1, pp=0) == "tp1pp0"
    assert render("<dp>_<cp>_<ep>", dp=3, cp=0, ep=12) == "dp3_cp0_ep12"
    assert render("x[_<tp><pp><dp>]", pp=2) == "x_pp2"
    assert render("x[_<tp><pp><dp>]") == "x"


def test_unknown_fields_render_empty() -> None:
    assert render("<role>_<step>_<host>", role="a") == "a__"


def test_environment_fields() -> None:
    assert render("<env:JOB>_<rank>", **{"env:JOB": "job 17", "rank": 0}) == "job-17_0"


def test_placeholders_stand_for_late_fields() -> None:
    template = NameTemplate.parse(DEFAULT_TEMPLATE)
    values = {"prefix": "p", "role": "r", "rank": 0, "world": 2}
    assert template.render(values, placeholders=LATE_FIELDS) == (
        "r/p_rank0-of-2_pid<pid>_<timestamp>")
    assert template.render({**values, "pid": 7}, placeholders=LATE_FIELDS) == (
        "r/p_rank0-of-2_pid7_<timestamp>")


def test_bind_fixes_values_and_render_fills_the_rest() -> None:
    template = NameTemplate.parse("<role>_<rank>_<step>").bind({"role": "a b", "rank": 3,
                                                               "unused": 1})
    assert template.bound == (("rank", "3"), ("role", "a-b"))
    assert template.render({"step": 9, "role": "ignored"}) == "a-b_3_9"


def test_sub_folders() -> None:
    assert render("<role>/rank<rank>[/step<step>]", role="actor", rank=1) == "actor/rank1"
    assert render("<role>/rank<rank>[/step<step>]", role="actor", rank=1, step="2-3") == (
        "actor/rank1/step2-3")
    # A field that renders empty leaves no empty folder behind.
    assert render("<prefix>/<role>", role="a") == "a"


def test_a_name_is_never_empty() -> None:
    assert render("<region>") == EMPTY_NAME
    assert render("[<region>/]") == EMPTY_NAME


# ---------------------------------------------------------------- sanitizing


@pytest.mark.parametrize(("value", "expected"), [
    ("update_actor", "update-actor"),
    ("a b/c\\d", "a-b-c-d"),
    ("a__b", "a-b"),  # a run of other characters is one "-"
    ("x.y=z+w-v", "x.y=z+w-v"),
    ("Qwen/Qwen2.5-7B", "Qwen-Qwen2.5-7B"),
    ("größe", "gr-e"),
    ("<pid>", "-pid-"),
    (12, "12"),
    ("", ""),
])
def test_sanitize(value: object, expected: str) -> None:
    assert sanitize(value) == expected


def test_underscore_never_appears_inside_a_value() -> None:
    name = render("<role>_<region>_<prefix>", role="critic_v2", region="fwd_bwd", prefix="a_b")
    assert name == "critic-v2_fwd-bwd_a-b"
    assert name.split("_") == ["critic-v2", "fwd-bwd", "a-b"]


def test_values_cannot_climb_out_of_the_output_folder() -> None:
    assert render("<prefix>", prefix="..") == "--"
    assert render("a/<prefix>/b", prefix="...") == "a/---/b"
    assert render("<prefix>/<role>", prefix="/etc", role="x") == "-etc/x"
    assert render(".<prefix>", prefix=".") == "--"


# ---------------------------------------------------------------- 255-byte components


def test_long_components_are_shortened_deterministically() -> None:
    long = "a" * 300
    name = render("<prefix>_<rank>/x", prefix=long, rank=0)
    first, second = name.split("/")
    assert second == "x"
    assert len(first.encode()) == MAX_COMPONENT_BYTES
    digest = hashlib.sha256(f"{long}_0".encode()).hexdigest()[:10]
    assert first == "a" * (MAX_COMPONENT_BYTES - 11) + "-" + digest
    assert render("<prefix>_<rank>/x", prefix=long, rank=0) == name  # deterministic
    other = render("<prefix>_<rank>/x", prefix=long, rank=1)
    assert other != name  # the cut part differs, the hash tells them apart
    assert other.split("/")[0][:-11] == first[:-11]


def test_components_at_the_limit_are_kept() -> None:
    exact = "b" * MAX_COMPONENT_BYTES
    assert render("<prefix>", prefix=exact) == exact
    assert render("<prefix>", prefix=exact + "c") != exact + "c"


# ---------------------------------------------------------------- any template, any values


_literal = st.text(alphabet="abz09._=+-/", min_size=1, max_size=6)
_field = st.sampled_from([f"<{f}>" for f in FIELDS] + ["<env:X>"])
_group = st.lists(st.one_of(_literal, _field), min_size=1, max_size=3).map(
    lambda parts: "[<role>" + "".join(parts) + "]")
_piece = st.one_of(_literal, _field, _group)
_values = st.one_of(st.none(), st.integers(-5, 10 ** 6), st.text(max_size=300),
                    st.sampled_from(["..", ".", "/", "../..", "a/../b", "/abs", "x" * 400]))


@settings(max_examples=300, deadline=None)
@given(st.lists(_piece, min_size=1, max_size=8).map("".join),
       st.dictionaries(st.sampled_from([*FIELDS, "env:X"]), _values))
def test_rendered_names_are_safe_paths(text: str, values: dict[str, object]) -> None:
    try:
        template = NameTemplate.parse(text)
    except TemplateError:
        return
    for placeholders in (frozenset(), LATE_FIELDS):
        name = template.render(values, placeholders=placeholders)
        assert name
        assert not name.startswith("/")
        for component in name.split("/"):
            assert component not in ("", ".", ".."), name
            assert len(component.encode()) <= MAX_COMPONENT_BYTES
        if not placeholders:
            assert set(name) <= set("0123456789abcdefghijklmnopqrstuvwxyz"
                                    "ABCDEFGHIJKLMNOPQRSTUVWXYZ._=+-/")


# ---------------------------------------------------------------- <step> of merged cycles


@pytest.mark.parametrize(("role", "per_cycle"), [
    ({"steps": "all", "merge_steps": True,
      "schedule": {"wait": 96, "warmup": 3, "active": 1, "repeat": 0}}, True),
    ({"steps": {"every": 1, "from": 10}, "merge_steps": True,
      "schedule": {"active": 1, "repeat": 1}}, True),  # endless: one trace, its own step
    ({"steps": "10-12", "merge_steps": True, "schedule": {"active": 2, "repeat": 2}}, True),
    ({"steps": "10-12", "merge_steps": True, "schedule": {"active": 2, "repeat": 1}}, False),
    ({"steps": "all", "merge_steps": True}, False),  # no schedule: the capture is the trace
    ({"steps": "all", "schedule": {"active": 1}}, False),  # not merged: a capture per step
])
def test_merged_cycles_render_their_own_step(role: dict[str, object], per_cycle: bool) -> None:
    from policy_engine import Topology, compile_plan, load_policy

    policy = load_policy({"version": 1, "roles": {"r": {
        "enabled": True, "name": "iteration_<step>/rank<rank>[_c<cycle>]", **role}}})
    plan = compile_plan(policy, "r", Topology(rank=3, world=4))
    assert plan.step_per_cycle is per_cycle
    first = plan.steps.first()
    assert first is not None
    span = plan.capture_label(first)
    assert plan.capture_name(first=first, region=None, cycle=0) == f"iteration_{span}/rank3_c0"
    # the runtime (and explain) pass the step the cycle started recording in
    assert plan.capture_name(first=first, region=None, cycle=2, at=400) == \
        "iteration_400/rank3_c2"
    assert plan.capture_name(first=None, region=None, cycle=None) == "iteration_/rank3"
