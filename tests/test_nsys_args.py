"""nsys launch arguments from the plan: capture counts, --capture-range-end, -o, the CLI.

The capture counts are checked against the runtime itself: a loop driven through the
recording backend must open exactly as many capture ranges (``start()`` calls) as
``count_ranges`` promised nsys.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_engine import Topology, compile_plan, load_policy, profile_session
from policy_engine.backends.nsight.launch import (
    NsysArgsError,
    capture_range_end,
    nsys_output,
    nsys_profile_args,
    options_problems,
    report_path,
    resolve_output,
)
from policy_engine.cli.main import main
from policy_engine.language.schema import build as schema
from policy_engine.language.values.steps import StepSet
from policy_engine.plan.captures import count_ranges
from policy_engine.plan.plan import Plan
from policy_engine.testing import recording_backend

ROOT = Path(__file__).resolve().parent.parent
ROLLOUT = ROOT / "policies" / "nsight_rollout.yaml"
NVTX = ["--capture-range=nvtx", "--nvtx-capture=policy_engine.capture@policy_engine"]


#: <cycle> and <region> keep the engine's uniqueness check quiet; nsys itself numbers the
#: reports of a process and never sees them.
NAME = "<prefix>_<role>[_<region>][_step<step>][_c<cycle>]_rank<rank>-of-<world>_pid<pid>"


def policy(out: Path, **role: Any) -> dict[str, Any]:
    body = {"enabled": True, "backend": "nsight", "ranks": "all", "name": NAME, **role}
    return {"version": 1, "prefix": "p", "output_dir": str(out), "roles": {"actor": body}}


def plan(out: Path, rank: int = 0, world: int = 1, **role: Any) -> Plan:
    return compile_plan(load_policy(policy(out, **role)), "actor", Topology(rank=rank, world=world))


def opened(out: Path, role: dict[str, Any], *, inner: int, calls: int, plain: bool = False) -> int:
    """Capture ranges the runtime opens: one per session start(). Each profiled step (or
    the session) makes ``inner`` prof.step() calls, or calls each region ``calls`` times
    with ``inner`` prof.step() calls inside in discrete mode."""
    p = plan(out, **role)
    with recording_backend("nsight", write_files=False) as rec:
        prof = profile_session(policy(out, **role), "actor", Topology(rank=0, world=1))

        def work() -> None:
            for region in p.regions:
                for _ in range(calls):
                    with prof.region(region.name):
                        for _ in range(inner if p.discrete else 0):
                            prof.step()
            for _ in range(0 if p.discrete else inner):
                prof.step()

        if plain:  # the torch.profiler way: the capture opens on entering the profiler
            with prof:
                work()
        else:
            for n in range(max(role["steps"]) + 2):
                with prof.training_step(n):
                    work()
        prof.close()
    return sum(1 for call in rec.calls if call == ("start",))


# ---------------------------------------------------------------- counting


@pytest.mark.parametrize(
    ("role", "total"),
    [
        ({"steps": [2, 4]}, 2),  # continuous: one per step
        ({"steps": [2, 3, 4, 7]}, 4),
        ({"steps": [2, 3, 4, 7], "merge_steps": True}, 2),  # runs 2-4 and 7
        ({"steps": "10-20:5"}, 3),
        ({"steps": [1, 2], "schedule": {"wait": 1, "active": 2, "repeat": 3}}, 6),
        ({"steps": [1, 2], "merge_steps": True, "schedule": {"active": 1, "repeat": 2}}, 2),
        ({"steps": "all"}, None),  # unbounded run
        ({"steps": [1], "schedule": {"active": 2, "repeat": 0}}, None),  # repeats until the end
        ({"steps": [1, 2], "discrete": True, "regions": ["a", "b"]}, None),  # calls unknown
    ],
)
def test_count_from_the_plan(tmp_path: Path, role: dict[str, Any], total: int | None) -> None:
    assert count_ranges(plan(tmp_path, **role)).total == total


def test_plain_loop_is_one_capture(tmp_path: Path) -> None:
    assert count_ranges(plan(tmp_path, steps="all"), plain_loop=True).total == 1
    assert (
        count_ranges(plan(tmp_path), plain_loop=True).why
        == "1 capture in the session x 1 range each (no schedule: the whole capture)"
    )


def test_unknown_counts_say_what_is_missing(tmp_path: Path) -> None:
    count = count_ranges(plan(tmp_path, steps=[1], discrete=True, regions=["a"]))
    assert count.why == (
        "discrete: 1 profiled step x an unknown number of calls of each of "
        "1 regions x their cycles (give --region-calls to count them)"
    )


def test_run_lengths() -> None:
    steps = StepSet.parse([1, 2, 3, "4-6", 8, "10-14:2"])
    assert steps.run_lengths() == {6: 1, 1: 4}
    assert StepSet.parse([]).run_lengths() == {}
    assert StepSet.parse("all").run_lengths() is None


CASES = [
    ({"steps": [1, 3]}, 2, 0),
    ({"steps": [1, 2, 4], "merge_steps": True}, 3, 0),
    ({"steps": [0, 2], "schedule": {"wait": 1, "warmup": 1, "active": 2, "repeat": 2}}, 9, 0),
    ({"steps": [1], "schedule": {"skip_first": 2, "active": 1, "repeat": 0}}, 5, 0),
    (
        {
            "steps": [1, 2],
            "discrete": True,
            "regions": {
                "a": {},
                "b": {"enabled": False},
                "c": {"schedule": {"active": 1, "repeat": 2}},
            },
        },
        3,
        2,
    ),
]


@pytest.mark.parametrize(("role", "inner", "calls"), CASES)
def test_count_matches_the_runtime(
    tmp_path: Path, role: dict[str, Any], inner: int, calls: int
) -> None:
    expected = count_ranges(plan(tmp_path, **role), inner_steps=inner, region_calls=calls)
    assert expected.total == opened(tmp_path, role, inner=inner, calls=calls)


@settings(max_examples=40, deadline=None)
@given(
    wait=st.integers(0, 2),
    warmup=st.integers(0, 2),
    active=st.integers(1, 3),
    repeat=st.integers(0, 3),
    skip_first=st.integers(0, 3),
    inner=st.integers(0, 12),
    merge=st.booleans(),
    plain=st.booleans(),
)
def test_one_range_per_recorded_cycle(
    tmp_path_factory: pytest.TempPathFactory,
    wait: int,
    warmup: int,
    active: int,
    repeat: int,
    skip_first: int,
    inner: int,
    merge: bool,
    plain: bool,
) -> None:
    out = tmp_path_factory.mktemp("out")
    role = {
        "steps": [1, 2, 4],
        "merge_steps": merge,
        "schedule": {
            "wait": wait,
            "warmup": warmup,
            "active": active,
            "repeat": repeat,
            "skip_first": skip_first,
        },
    }
    count = count_ranges(plan(out, **role), inner_steps=inner, plain_loop=plain)
    assert count.total == opened(out, role, inner=inner, calls=0, plain=plain)


# ---------------------------------------------------------------- --capture-range-end


@pytest.mark.parametrize(
    ("setting", "ranges", "value"),
    [
        ("auto", 3, "repeat-shutdown:3"),
        ("auto", None, "repeat"),
        ("repeat", 3, "repeat:3"),
        ("repeat", None, "repeat"),
        ("repeat-shutdown", 1, "repeat-shutdown:1"),
        ("stop", 3, "stop"),
        ("stop-shutdown", None, "stop-shutdown"),
    ],
)
def test_capture_range_end(setting: str, ranges: int | None, value: str) -> None:
    assert capture_range_end(setting, ranges)[0] == value


@pytest.mark.parametrize(
    ("setting", "ranges", "message"),
    [
        ("repeat-shutdown", None, "repeat-shutdown needs a known number of capture ranges"),
        ("auto", 0, "the plan opens no capture range: launch without nsys"),
    ],
)
def test_capture_range_end_errors(setting: str, ranges: int | None, message: str) -> None:
    with pytest.raises(NsysArgsError, match=message):
        capture_range_end(setting, ranges)


def args(**kw: Any) -> list[str]:
    kw.setdefault("capture", "nvtx")
    kw.setdefault("capture_range_end_setting", "auto")
    kw.setdefault("options", {"trace": "cuda,nvtx"})
    kw.setdefault("output", "/o/x")
    return list(nsys_profile_args(**kw).args)


def test_nvtx_capture_with_exact_count() -> None:
    assert args(ranges=2) == [
        *NVTX,
        "--capture-range-end=repeat-shutdown:2",
        "--kill=none",
        "--trace=cuda,nvtx",
        "-o",
        "/o/x",
    ]


def test_cuda_profiler_api_and_auto() -> None:
    assert args(capture="cuda_profiler_api", ranges=1)[:2] == [
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=repeat-shutdown:1",
    ]
    # auto opens the NVTX range in every process, so it launches as nvtx everywhere
    assert args(capture="auto", ranges=1)[:2] == NVTX


def test_kill_none_only_when_nsys_shuts_down() -> None:
    assert "--kill=none" not in args(ranges=2, capture_range_end_setting="repeat")
    assert "--kill=none" in args(ranges=2, capture_range_end_setting="stop-shutdown")
    kept = args(ranges=2, options={"trace": "nvtx", "kill": "sigterm"})
    assert "--kill=sigterm" in kept
    assert "--kill=none" not in kept


def test_options_render_like_ray() -> None:
    launch = nsys_profile_args(
        capture="nvtx",
        ranges=None,
        capture_range_end_setting="repeat",
        options={"t": "nvtx", "cuda_memory_usage": True, "delay": 5},
        output=None,
    )
    assert launch.args[3:] == ("-t", "nvtx", "--cuda-memory-usage=true", "--delay=5")
    assert launch.ray == {
        "capture-range": "nvtx",
        "nvtx-capture": "policy_engine.capture@policy_engine",
        "capture-range-end": "repeat",
        "t": "nvtx",
        "cuda-memory-usage": "true",
        "delay": "5",
    }
    assert launch.notes[0] == "reports: when the process exits"


@pytest.mark.parametrize(
    ("settings_", "problems"),
    [
        ({"options": {"trace": "cuda,nvtx"}}, []),
        (
            {"options": {"trace": "nvtx", "o": "x"}},
            [
                (
                    "option 'o' is set by the engine: the policy's name template sets it",
                    ("options", "o"),
                )
            ],
        ),
        (
            {"options": {"trace": "nvtx", "capture_range_end": "stop"}},
            [
                (
                    "option 'capture_range_end' is set by the engine: "
                    "set nsight.capture_range_end instead",
                    ("options", "capture_range_end"),
                )
            ],
        ),
        (
            {"options": {"trace": "nvtx", "t": "nvtx"}},
            [
                (
                    "options 'trace' and 't' both set nsys --trace: keep one "
                    "(the defaults set it as 'trace')",
                    ("options", "t"),
                )
            ],
        ),
        (
            {"options": {"trace": "nvtx", "env-var": "A=1 B=2"}},
            [("option 'env-var': value 'A=1 B=2' must not contain spaces", ("options", "env-var"))],
        ),
        (
            {"capture": "nvtx", "options": {"trace": "cuda"}},
            [("capture by NVTX range needs 'nvtx' in options.trace (got 'cuda')", ("options",))],
        ),
        (
            {"capture": "cuda_profiler_api", "options": {"trace": "cuda"}},
            [
                (
                    "ranges: true needs 'nvtx' in options.trace (got 'cuda'); or set ranges: false",
                    ("ranges",),
                )
            ],
        ),
        ({"capture": "cuda_profiler_api", "ranges": False, "options": {"trace": "cuda"}}, []),
    ],
)
def test_settings_checks(settings_: dict[str, Any], problems: list[Any]) -> None:
    merged = {**schema.defaults("role")["nsight"], **settings_}  # as a plan carries it
    assert options_problems(merged) == problems


# ---------------------------------------------------------------- -o and report names


def test_output_uses_nsys_substitutions(tmp_path: Path) -> None:
    p = plan(tmp_path, rank=1, world=2)
    assert nsys_output(p.template, p.output_dir) == f"{tmp_path}/p_actor_rank1-of-2_pid%p"
    assert (
        nsys_output(p.template, p.output_dir, generic_rank=True)
        == f"{tmp_path}/p_actor_rank%q{{RANK}}-of-2_pid%p"
    )


def test_output_fields_only_launch_knows(tmp_path: Path) -> None:
    p = plan(
        tmp_path, name="<role>/<host>/<env:JOB_ID>_x<step>_<region>_<timestamp>_<pid>", ranks=[0]
    )
    assert nsys_output(p.template, "/o") == "/o/actor/%h/%q{JOB_ID}_x_%p"


def test_resolve_output_as_nsys_does() -> None:
    env = {"RANK": "3"}
    assert (
        resolve_output("/o/r%q{RANK}_%q{UNSET}_%h_%p_100%%", pid=42, host="node1", environ=env)
        == "/o/r3_%q{UNSET}_node1_42_100%"
    )


def test_report_paths() -> None:
    assert report_path("/o/x", 0, numbered=True) == "/o/x.1.nsys-rep"
    assert report_path("/o/x", 0, numbered=False) == "/o/x.nsys-rep"


# ---------------------------------------------------------------- the CLI


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["nsys-args", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_example_policy_shell(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, str(ROLLOUT), "--role", "rollout", "--world", "8")
    assert code == 0
    folder = ROOT / "policies" / "profiles" / "nsys"
    body = out.split('case "${RANK:?RANK is not set}" in\n')[1]
    assert body.splitlines()[:13] == [
        "  0|1|2|3)",
        f"    mkdir -p {folder}/rollout",
        '    set -- "${NSYS:-nsys}" profile \\',
        "      --capture-range=nvtx \\",
        "      --nvtx-capture=policy_engine.capture@policy_engine \\",
        "      --capture-range-end=repeat-shutdown:2 \\",
        "      --kill=none \\",
        "      --trace=cuda,nvtx,osrt \\",
        f"      -o '{folder}/rollout/rollout_rank%q{{RANK}}-of-8_pid%p' \\",
        """      sh -c 'echo $$ > "$0"; exec "$@"' "$pidfile" "$@" ;;""",
        "  *)",
        '    rm -f "$pidfile"',
        '    exec "$@" ;;',
    ]
    assert "# It reads RANK. Ranks 4-7 do not profile and run the command without nsys." in out


def test_example_policy_json_and_ray(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, str(ROLLOUT), "--role", "rollout", "--world", "8", "--format", "json"
    )
    data = json.loads(out)
    assert code == 0
    assert (data["profiled_ranks"], data["unprofiled_ranks"]) == ("0-3", "4-7")
    assert data["ranges_per_process"] == 2
    assert data["capture_range_end"] == "repeat-shutdown:2"
    rank3 = data["ranks"]["3"]
    assert [Path(r).name for r in rank3["reports"]] == [
        "rollout_rank3-of-8_pid%p.1.nsys-rep",
        "rollout_rank3-of-8_pid%p.2.nsys-rep",
    ]
    code, out, err = run_cli(
        capsys, str(ROLLOUT), "--role", "rollout", "--world", "8", "--format", "ray", "--rank", "3"
    )
    assert json.loads(out) == rank3["ray"]
    assert err == "# ranks 4-7 do not profile: give their workers no 'nsight' key in runtime_env\n"
    code, out, _ = run_cli(
        capsys, str(ROLLOUT), "--role", "rollout", "--world", "8", "--format", "ray", "--rank", "6"
    )
    assert (code, json.loads(out)) == (0, None)


def write(tmp_path: Path, role: str) -> str:
    path = tmp_path / "p.yaml"
    path.write_text(f"version: 1\nmesh: {{dp: 2, tp: 2}}\nroles:\n  actor: {role}\n")
    return str(path)


def test_coordinates_in_names_give_one_branch_per_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "{enabled: true, backend: nsys, ranks: {tp: 0}, steps: [1]}")
    code, out, _ = run_cli(capsys, path, "--role", "actor")
    assert code == 0
    assert "  0)" in out and "  2)" in out
    assert "rank2-of-4_tp0dp1_pid%p" in out


def test_unknown_count_with_repeat_shutdown_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        "{enabled: true, backend: nsight, steps: all, "
        "nsight: {capture_range_end: repeat-shutdown}}",
    )
    code, _, err = run_cli(capsys, path, "--role", "actor")
    assert code == 1
    assert "repeat-shutdown needs a known number of capture ranges" in err
    code, out, _ = run_cli(capsys, path, "--role", "actor", "--plain-loop")
    assert code == 0
    assert "--capture-range-end=repeat-shutdown:1" in out


def test_role_on_another_backend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, write(tmp_path, "{enabled: true}"), "--role", "actor")
    assert code == 2
    assert "role 'actor' profiles with torch, not nsight" in err


def test_documented_output_is_current(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/nsight.md shows what nsys-args prints for the example policy."""
    doc = (ROOT / "docs" / "nsight.md").read_text()
    marker = "<!-- nsys-args shell: policy-engine "
    command = doc.split(marker)[1].split(" -->")[0].split()
    documented = doc.split(marker)[1].split("```sh\n")[1].split("```")[0]
    monkeypatch.chdir(ROOT)
    assert main(command) == 0
    assert capsys.readouterr().out.replace(str(ROOT), "/srv/exp") == documented
