"""policy-engine from-verl: verl's profiler settings as a policy.

The rules are checked on small verl-shaped configs; then each of verl's example profiling
scripts is composed with Hydra from the installed verl wheel, converted, validated, and
compared rank by rank and step by step with what verl's own DistProfiler selects."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import pytest

from policy_engine import Topology, compile_plan, load_policy
from policy_engine.cli.main import main
from policy_engine.errors import PolicyError
from policy_engine.integrations.verl_config import convert_mapping, policy_text
from policy_engine.integrations.verl_config.overrides import parse_value
from policy_engine.integrations.verl_config.resolve import InterpolationError, Resolver
from policy_engine.language.load import analyze
from policy_engine.language.read.source import parse_document

SCHEDULE = {"skip_first": 0, "wait": 0, "warmup": 0, "active": 0, "repeat": 0}
GLOBAL = "${oc.select:global_profiler.%s,%s}"


def _block(enable: Any = False, ranks: Any = None, all_ranks: Any = False) -> dict[str, Any]:
    """A role's profiler block as a composed verl config holds it (interpolations kept)."""
    return {
        "tool": GLOBAL % ("tool", "null"),
        "enable": enable,
        "all_ranks": all_ranks,
        "ranks": [] if ranks is None else ranks,
        "save_path": GLOBAL % ("save_path", "null"),
        "tool_config": {
            "torch": {"contents": [], "discrete": False, "schedule": dict(SCHEDULE)},
            "npu": {"contents": [], "level": "level0", "analysis": True, "discrete": False},
            "nsys": {"discrete": "${oc.select:global_profiler.global_tool_config.nsys.discrete}"},
            "torch_memory": {
                "trace_alloc_max_entries": "${oc.select:global_profiler.global_tool_config."
                                           "torch_memory.trace_alloc_max_entries,100000}",
                "stack_depth": 32,
                "memory_snapshot_num_steps": 1,
            },
        },
    }


def config() -> dict[str, Any]:
    rollout = _block("${oc.select:actor_rollout_ref.actor.profiler.enable,false}")
    rollout["tool_config"]["torch"].pop("schedule")
    rollout["tool_config"]["torch"].update(profile_token_start=None, profile_token_end=None)
    return {
        "trainer": {"experiment_name": "exp 1", "n_gpus_per_node": 8, "nnodes": 1},
        "algorithm": {"adv_estimator": "grpo"},
        "global_profiler": {
            "tool": None, "steps": None, "profile_continuous_steps": False,
            "save_path": "outputs/profile", "finish_hook_cmd": None,
            "global_tool_config": {
                "nsys": {"discrete": False, "worker_nsight_options": {
                    "trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true",
                    "cuda-graph-trace": "graph", "capture-range": "cudaProfilerApi",
                    "capture-range-end": None, "kill": "none"}},
                "torch_memory": {"trace_alloc_max_entries": 100000},
            },
        },
        "actor_rollout_ref": {
            "actor": {"profiler": _block()},
            "ref": {"profiler": _block()},
            "rollout": {"name": "vllm", "tensor_model_parallel_size": 2,
                        "data_parallel_size": 1, "pipeline_model_parallel_size": 1,
                        "profiler": rollout},
        },
        "critic": {"enable": None, "profiler": _block()},
    }


ACTOR = "actor_rollout_ref.actor.profiler"
TORCH_ON = ["global_profiler.tool=torch", "global_profiler.steps=[2,3]", f"{ACTOR}.enable=True"]


def convert(*sets: str) -> Any:
    return convert_mapping(config(), sets, cwd="/runs/job")


def role(conv: Any, name: str) -> dict[str, Any]:
    return conv.policy["roles"][name]  # type: ignore[no-any-return]


# -- interpolations -------------------------------------------------------------------


@pytest.mark.parametrize(("key", "expected"), [
    ("absolute", 1),
    ("relative", 1),
    ("parent", 1),
    ("select_missing", 5),
    ("select_null", None),
    ("nested_default", 7),
    ("inside_text", "x1y"),
    ("list_default", []),
])
def test_interpolations_resolve_as_omegaconf_does(key: str, expected: Any) -> None:
    data = {
        "a": {"b": 1, "n": None, "rel": "${.b}", "up": {"c": "${..b}"}},
        "absolute": "${a.b}", "relative": "${a.rel}", "parent": "${a.up.c}",
        "select_missing": "${oc.select:a.zz,5}", "select_null": "${oc.select:a.n,5}",
        "nested_default": "${oc.select:a.zz,${oc.select:a.yy,7}}",
        "inside_text": "x${a.b}y", "list_default": "${oc.select:a.zz,[]}",
    }
    assert Resolver(data).get(key) == expected


@pytest.mark.parametrize(("value", "message"), [
    ("${oc.create:x}", "v: cannot resolve ${oc.create:x}: the resolver 'oc.create' is not one "
                       "the converter knows (oc.select, oc.env); give the value itself with --set"),
    ("${nowhere.key}", "v: ${nowhere.key} names a key that is not in the config"),
    ("${v}", "interpolation loop at v: ${v}"),
])
def test_interpolation_errors(value: str, message: str) -> None:
    with pytest.raises(InterpolationError) as err:
        Resolver({"v": value}).get("v")
    assert str(err.value) == message


# -- overrides --------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "value"), [
    ("[1,2]", [1, 2]),
    ("True", True),
    ("null", None),
    ("['cpu','cuda']", ["cpu", "cuda"]),
    ("/home/u/profile_data", "/home/u/profile_data"),
    ("level0", "level0"),
    ("100000", 100000),
])
def test_override_values_read_as_verl_command_lines_give_them(text: str, value: Any) -> None:
    assert parse_value(text) == value


@pytest.mark.parametrize(("override", "message"), [
    ("global_profiler.stepz=[1]",
     "--set global_profiler.stepz=[1]: error: global_profiler.stepz is not in the config "
     "(to add it, write +global_profiler.stepz=[1]) (at $.global_profiler.stepz)"),
    ("nothing.here=1",
     "--set nothing.here=1: error: nothing is not in the config (to add nothing.here, write "
     "+nothing.here=1) (at $.nothing)"),
    ("+global_profiler.steps=[1]",
     "--set +global_profiler.steps=[1]: error: global_profiler.steps is already in the config "
     "(to replace it, write global_profiler.steps=[1] or ++global_profiler.steps=[1]) "
     "(at $.global_profiler.steps)"),
    ("global_profiler.tool.x=1",
     "--set global_profiler.tool.x=1: error: cannot set global_profiler.tool.x: "
     "global_profiler.tool is not a mapping (at $.global_profiler.tool)"),
    ("global_profiler.steps", "--set global_profiler.steps: error: override needs KEY=VALUE, "
                              "got 'global_profiler.steps' (at $)"),
])
def test_override_errors(override: str, message: str) -> None:
    with pytest.raises(PolicyError) as err:
        convert(override)
    assert [p.render() for p in err.value.problems] == [message]


def test_plus_adds_and_tilde_removes() -> None:
    conv = convert(*TORCH_ON, "+trainer.new_key=1", "~actor_rollout_ref.ref")
    assert role(conv, "ref") == {"enabled": False}
    assert conv.comments[("roles", "ref")] == [
        "actor_rollout_ref.ref.profiler is not in this config: the role is off"]


# -- translation rules ------------------------------------------------------------------


@pytest.mark.parametrize(("contents", "activities", "flags"), [
    ("[]", ["cpu", "cuda"], []),
    ("[cpu]", ["cpu"], []),
    ("[cuda]", ["cpu", "cuda"], []),
    ("[cpu,cuda,shapes]", ["cpu", "cuda"], ["record_shapes"]),
    ("[memory,stack]", ["cpu"], ["profile_memory", "with_stack"]),
])
def test_torch_contents(contents: str, activities: list[str], flags: list[str]) -> None:
    conv = convert(*TORCH_ON, f"{ACTOR}.tool_config.torch.contents={contents}")
    torch = role(conv, "actor")["torch"]
    assert torch["activities"] == activities
    assert [f for f in ("record_shapes", "profile_memory", "with_stack") if torch[f]] == flags


@pytest.mark.parametrize(("contents", "activities", "flags"), [
    ("[]", ["cpu"], []),
    ("[npu,cpu]", ["cpu", "npu"], []),
    ("[npu,module,shapes]", ["cpu", "npu"], ["record_shapes", "with_modules"]),
])
def test_npu_contents(contents: str, activities: list[str], flags: list[str]) -> None:
    conv = convert("global_profiler.tool=npu", "global_profiler.steps=[2]",
                   f"{ACTOR}.enable=True", f"{ACTOR}.tool_config.npu.contents={contents}",
                   f"{ACTOR}.tool_config.npu.level=level1")
    mstx = role(conv, "actor")["mstx"]
    assert role(conv, "actor")["backend"] == "mstx"
    assert mstx["activities"] == activities and mstx["level"] == "level1"
    assert [f for f in ("record_shapes", "with_modules", "with_stack") if mstx[f]] == flags
    assert (mstx["export_type"], mstx["mstx_domain_exclude"], mstx["analysis"]) == (
        "db", ["communication"], True)


@pytest.mark.parametrize(("sets", "ranks"), [
    ([], [0]),
    ([f"{ACTOR}.ranks=[3,1]"], [1, 3]),
    ([f"{ACTOR}.all_ranks=True", f"{ACTOR}.ranks=[1]"], "all"),
])
def test_ranks(sets: list[str], ranks: Any) -> None:
    assert role(convert(*TORCH_ON, *sets), "actor")["ranks"] == ranks


@pytest.mark.parametrize(("sets", "steps", "merge"), [
    (["global_profiler.steps=null"], [], False),
    (["global_profiler.steps=[5,1,5]"], [1, 5], False),
    (["global_profiler.profile_continuous_steps=True"], [2, 3], True),
    (["global_profiler.profile_continuous_steps=True",
      f"{ACTOR}.tool_config.torch.discrete=True"], [2, 3], False),
])
def test_steps_and_merge(sets: list[str], steps: list[int], merge: bool) -> None:
    actor = role(convert(*TORCH_ON, *sets), "actor")
    assert (actor["steps"], actor["merge_steps"]) == (steps, merge)


@pytest.mark.parametrize(("discrete", "repeat", "schedule", "regions"), [
    (False, 0, {"skip_first": 1, "wait": 0, "warmup": 1, "active": 2, "repeat": 1}, None),
    (False, 3, {"skip_first": 1, "wait": 0, "warmup": 1, "active": 2, "repeat": 3}, None),
    (True, 0, None, {"actor_update": {"schedule": {"skip_first": 1, "wait": 0, "warmup": 1,
                                                   "active": 2, "repeat": 0}},
                     "actor_compute_log_prob": {}, "ref_compute_log_prob": {}}),
])
def test_schedule(discrete: bool, repeat: int, schedule: Any, regions: Any) -> None:
    prefix = f"{ACTOR}.tool_config.torch"
    actor = role(convert(*TORCH_ON, f"{prefix}.discrete={discrete}",
                         f"{prefix}.schedule.active=2", f"{prefix}.schedule.skip_first=1",
                         f"{prefix}.schedule.warmup=1", f"{prefix}.schedule.repeat={repeat}"),
                 "actor")
    assert actor["schedule"] == schedule
    assert actor["regions"] == (regions or
                                ["actor_update", "actor_compute_log_prob", "ref_compute_log_prob"])


def test_schedule_without_active_records_the_whole_step() -> None:
    conv = convert(*TORCH_ON, f"{ACTOR}.tool_config.torch.schedule.warmup=2")
    assert role(conv, "actor")["schedule"] is None


def test_nsys_options_and_what_the_engine_sets() -> None:
    conv = convert("global_profiler.tool=nsys", "global_profiler.steps=[1]", f"{ACTOR}.enable=True")
    actor = role(conv, "actor")
    assert actor["backend"] == "nsight"
    assert actor["nsight"] == {"capture": "cuda_profiler_api", "options": {
        "trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true", "cuda-graph-trace": "graph"}}
    key = "global_profiler.global_tool_config.nsys.worker_nsight_options"
    assert conv.unmapped == [
        f"{key}.capture-range=cudaProfilerApi: the engine sets it from the plan "
        "(nsight.capture and capture_range_end: auto)",
        f"{key}.kill=none: the engine sets it from the plan (nsight.capture and "
        "capture_range_end: auto)"]


def test_torch_memory_watches_for_oom_on_rank_0_without_enable() -> None:
    conv = convert("global_profiler.tool=torch_memory")
    actor = role(conv, "actor")
    assert (actor["enabled"], actor["backend"], actor["ranks"], actor["steps"]) == (
        True, "memory", [0], [])
    assert actor["memory"] == {"max_entries": 100000, "stacks": "all", "context": "all",
                               "history": "always", "on_oom": True}
    enabled = role(convert("global_profiler.tool=torch_memory", "global_profiler.steps=[4]",
                           f"{ACTOR}.enable=True"), "actor")
    assert enabled["steps"] == [4]


def test_a_tool_without_equivalent_is_listed() -> None:
    conv = convert("global_profiler.tool=precision_debugger", f"{ACTOR}.enable=True")
    assert role(conv, "actor") == {"enabled": False}
    assert conv.unmapped[0] == (
        f"{ACTOR}.tool=precision_debugger: no policy backend records what verl's "
        "precision_debugger tool does; role 'actor' is left off")


def test_output_dir_is_absolute_and_prefix_from_the_experiment() -> None:
    conv = convert(*TORCH_ON)
    assert conv.policy["output_dir"] == "/runs/job/outputs/profile"
    assert conv.policy["prefix"] == "exp-1"
    assert convert(*TORCH_ON, "global_profiler.save_path=/abs/p").policy["output_dir"] == "/abs/p"


def test_rollout_engine_replicas() -> None:
    rollout = "actor_rollout_ref.rollout.profiler"
    conv = convert(*TORCH_ON, f"{rollout}.tool_config.torch.discrete=True",
                   f"{rollout}.ranks=[0,5]", f"{rollout}.tool_config.torch.contents=[shapes]",
                   f"{rollout}.tool_config.torch.profile_token_end=16")
    assert role(conv, "rollout") == {
        "enabled": True, "backend": "vllm", "mesh": {"dp": 4, "tp": 2},
        "ranks": {"dp": [0, 2]}, "steps": [2, 3],
        "schedule": {"skip_first": 0, "active": 16, "repeat": 1},
        "vllm": {"torch_profiler_with_stack": False, "torch_profiler_record_shapes": True,
                 "torch_profiler_with_memory": False}}
    # Not discrete: verl drives no engine profiler.
    assert role(convert(*TORCH_ON), "rollout") == {"enabled": False}


def test_colocation_and_a_ref_that_differs() -> None:
    ref = "actor_rollout_ref.ref.profiler"
    same = convert(*TORCH_ON, f"{ref}.enable=True")
    assert same.policy["colocate"] == [["actor", "ref"]]
    load_policy(same.policy)
    differs = convert(*TORCH_ON, f"{ref}.enable=True", f"{ref}.tool_config.torch.discrete=True")
    assert "colocate" not in differs.policy
    load_policy(differs.policy)


@pytest.mark.parametrize(("override", "message"), [
    (f"{ACTOR}.tool_config.torch.contents=[cpu,gpu]",
     f"{ACTOR}.tool_config.torch.contents[1]: 'gpu' is not one of verl's torch contents "
     "(cuda, cpu, memory, shapes, stack)"),
    ("global_profiler.steps=[1,-2]",
     "global_profiler.steps must be a list of steps >= 0, got [1, -2]"),
    (f"{ACTOR}.ranks=all", f"{ACTOR}.ranks must be a list of ranks >= 0, got 'all'"),
    (f"{ACTOR}.tool_config.torch.schedule.active=-1",
     f"{ACTOR}.tool_config.torch.schedule.active must be an integer >= 0, got -1"),
])
def test_values_verl_refuses(override: str, message: str) -> None:
    with pytest.raises(PolicyError) as err:
        convert(*TORCH_ON, override)
    (problem,) = err.value.problems
    assert problem.message == message
    assert problem.location is not None and problem.location.origin == f"--set {override}"


@pytest.mark.parametrize("tool", ["torch", "npu", "nsys", "torch_memory"])
@pytest.mark.parametrize("discrete", [False, True])
@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("ranks", ["[]", "[0,3]", "all"])
def test_every_combination_validates(tool: str, discrete: bool, continuous: bool,
                                     ranks: str) -> None:
    """The written policy validates, however the tool, mode, merging and ranks combine (a
    repeating schedule and a colocated ref included)."""
    ref = "actor_rollout_ref.ref.profiler"
    sets = [f"global_profiler.tool={tool}", "global_profiler.steps=[1,2,3,7]",
            f"global_profiler.profile_continuous_steps={continuous}",
            f"{ACTOR}.enable=True", f"{ref}.enable=True",
            f"{ACTOR}.tool_config.torch.schedule.active=2",
            f"{ACTOR}.tool_config.torch.schedule.wait=1"]
    for block in (ACTOR, ref):
        sets += [f"{block}.all_ranks=True"] if ranks == "all" else [f"{block}.ranks={ranks}"]
        if tool != "torch_memory":
            sets.append(f"{block}.tool_config.{tool}.discrete={discrete}")
    conv = convert(*sets)
    text = policy_text(conv, "cfg.yaml")
    result = analyze(parse_document(text, "out.yaml", "yaml"))
    assert [p.render() for p in result.errors] == []


def test_text_reads_back_as_the_policy() -> None:
    conv = convert(*TORCH_ON, "global_profiler.profile_continuous_steps=True")
    doc = parse_document(policy_text(conv, "cfg.yaml"), "out.yaml", "yaml")
    assert doc.data == conv.policy


# -- the command ----------------------------------------------------------------------


def _write_config(tmp_path: Path, *sets: str) -> Path:
    import yaml

    data = config()
    from policy_engine.integrations.verl_config import apply_overrides

    apply_overrides(data, sets)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_command_writes_a_valid_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = _write_config(tmp_path, *TORCH_ON, "global_profiler.finish_hook_cmd=upload")
    out = tmp_path / "p.yaml"
    assert main(["from-verl", str(cfg), "-o", str(out), "--set",
                 f"{ACTOR}.ranks=[0,3]"]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"wrote {out}\n"
    assert captured.err == ("policy-engine from-verl: no equivalent: global_profiler."
                            "finish_hook_cmd=upload: verl's finish hook keeps running under "
                            "the plugin; a policy has no command to run\n")
    text = out.read_text(encoding="utf-8")
    assert "    # actor_rollout_ref.actor.profiler.ranks\n    ranks: [0, 3]\n" in text
    assert f"output_dir: {tmp_path}/outputs/profile\n" in text
    assert main(["validate", str(out)]) == 0
    assert main(["from-verl", str(cfg), "-o", str(out)]) == 2
    assert capsys.readouterr().err.endswith(f"error: {out} exists (--force replaces it)\n")
    assert main(["from-verl", str(cfg), "-o", str(out), "--force"]) == 0


@pytest.mark.parametrize(("args", "code", "message"), [
    (["missing.yaml"], 2, "policy-engine from-verl: error: cannot read missing.yaml: "
                          "No such file or directory\n"),
    (["cfg.yaml", "-o", "p.txt"], 2,
     "policy-engine from-verl: error: p.txt: from-verl writes YAML; name the file .yaml or .yml\n"),
    (["cfg.yaml", "--set", "global_profiler.tool=torch", "--set", "global_profiler.steps=x"], 1,
     "--set global_profiler.steps=x: error: global_profiler.steps must be a list of steps >= 0, "
     "got 'x' (at $.global_profiler.steps)\n"),
])
def test_command_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                        monkeypatch: pytest.MonkeyPatch, args: list[str], code: int,
                        message: str) -> None:
    monkeypatch.chdir(tmp_path)
    _write_config(tmp_path)
    (tmp_path / "config.yaml").rename(tmp_path / "cfg.yaml")
    assert main(["from-verl", *args]) == code
    assert capsys.readouterr().err == message


def test_command_locates_a_bad_value_in_the_file(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _write_config(tmp_path, *TORCH_ON, f"{ACTOR}.tool_config.torch.contents=[gpu]")
    assert main(["from-verl", str(cfg), "-o", str(tmp_path / "p.yaml")]) == 1
    err = capsys.readouterr().err
    line = next(i for i, text in enumerate(cfg.read_text().splitlines(), 1) if "gpu" in text)
    assert err.startswith(f"{cfg}:{line}:")
    assert err.rstrip().endswith("'gpu' is not one of verl's torch contents (cuda, cpu, memory, "
                                 "shapes, stack) (at $.actor_rollout_ref.actor.profiler."
                                 "tool_config.torch.contents)")


def test_no_torch_hydra_or_omegaconf_imported() -> None:
    import subprocess
    import sys

    code = ("import sys; from policy_engine.cli.main import main; "
            "import policy_engine.cli.from_verl, policy_engine.integrations.verl_config; "
            "print(sorted(m for m in ('torch', 'hydra', 'omegaconf', 'verl') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"



UNCOMPOSED = "defaults:\n  - actor@actor_rollout_ref.actor: dp_actor\n  - _self_\ntrainer: {}\n"


def test_an_uncomposed_config_without_hydra_is_refused(tmp_path: Path) -> None:
    """A Hydra config still to compose (a top-level defaults: list) holds none of verl's
    profiler blocks: without Hydra it is refused, never converted to a policy that profiles
    nothing. (Hydra is kept from importing in the child; the shared venv has none anyway.)"""
    import subprocess
    import sys

    cfg = tmp_path / "ppo_trainer.yaml"
    cfg.write_text(UNCOMPOSED, encoding="utf-8")
    code = ("import sys; sys.modules['hydra'] = None; from policy_engine.cli.main import main; "
            f"sys.exit(main(['from-verl', {str(cfg)!r}, '-o', {str(tmp_path / 'p.yaml')!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"policy-engine from-verl: error: {cfg} is an uncomposed Hydra config (its top-level "
        "defaults: list names the files it is made from, which hold verl's profiler "
        "settings), and hydra-core is not installed here: pass the composed config Hydra "
        "saves in the run's folder (.hydra/config.yaml), or install hydra-core (pip install "
        "hydra-core) for from-verl to compose it\n")
    assert not (tmp_path / "p.yaml").exists()


# -- verl's own example scripts, composed by Hydra from the installed wheel -------------------

#: The profiling-relevant command-line overrides of verl's examples/profile/ scripts, with
#: their defaults (what each script passes when no environment variable changes it).
SCRIPTS: dict[str, list[str]] = {
    # examples/profile/run_qwen2_5_7b_torch_profile.sh
    "torch": [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.profiler.enable=True",
        "actor_rollout_ref.actor.profiler.ranks=[0]",
        "actor_rollout_ref.actor.profiler.all_ranks=False",
        "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=False",
        "actor_rollout_ref.actor.profiler.tool_config.torch.contents=['cpu','cuda']",
        "actor_rollout_ref.actor.profiler.tool_config.torch.schedule.active=0",
        "actor_rollout_ref.actor.profiler.tool_config.torch.schedule.skip_first=0",
        "actor_rollout_ref.actor.profiler.tool_config.torch.schedule.wait=0",
        "actor_rollout_ref.actor.profiler.tool_config.torch.schedule.warmup=0",
        "actor_rollout_ref.actor.profiler.tool_config.torch.schedule.repeat=0",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.profiler.enable=True",
        "actor_rollout_ref.rollout.profiler.ranks=[0]",
        "actor_rollout_ref.rollout.profiler.all_ranks=False",
        "actor_rollout_ref.rollout.profiler.tool_config.torch.discrete=True",
        "actor_rollout_ref.rollout.profiler.tool_config.torch.contents=['cpu','cuda']",
        "actor_rollout_ref.rollout.profiler.tool_config.torch.profile_token_start=null",
        "actor_rollout_ref.rollout.profiler.tool_config.torch.profile_token_end=null",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=1",
        "global_profiler.tool=torch",
        "global_profiler.steps=[1,2]",
        "global_profiler.save_path=/data/profile_data",
        "global_profiler.relocate_results=True",
        "global_profiler.finish_hook_cmd=null",
    ],
    # examples/profile/run_qwen3_8b_npu_profile_discrete.sh
    "npu_discrete": [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.profiler.enable=True",
        "actor_rollout_ref.actor.profiler.ranks=[1,2]",
        "actor_rollout_ref.actor.profiler.all_ranks=False",
        "actor_rollout_ref.actor.profiler.tool_config.npu.discrete=True",
        "actor_rollout_ref.actor.profiler.tool_config.npu.contents=['npu','cpu']",
        "actor_rollout_ref.actor.profiler.tool_config.npu.level=level0",
        "actor_rollout_ref.actor.profiler.tool_config.npu.analysis=True",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
        "actor_rollout_ref.ref.profiler.enable=True",
        "actor_rollout_ref.ref.profiler.ranks=[1,2]",
        "actor_rollout_ref.ref.profiler.all_ranks=False",
        "actor_rollout_ref.ref.profiler.tool_config.npu.discrete=True",
        "actor_rollout_ref.ref.profiler.tool_config.npu.contents=['npu','cpu']",
        "actor_rollout_ref.ref.profiler.tool_config.npu.level=level0",
        "actor_rollout_ref.ref.profiler.tool_config.npu.analysis=True",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=1",
        "global_profiler.tool=npu",
        "global_profiler.steps=[2,4]",
        "global_profiler.save_path=/data/profile_data",
    ],
    # examples/profile/run_qwen3_8b_npu_profile_e2e.sh
    "npu_e2e": [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.profiler.enable=True",
        "actor_rollout_ref.actor.profiler.all_ranks=True",
        "actor_rollout_ref.actor.profiler.tool_config.npu.discrete=False",
        "actor_rollout_ref.actor.profiler.tool_config.npu.contents=['npu','cpu']",
        "actor_rollout_ref.actor.profiler.tool_config.npu.level=level0",
        "actor_rollout_ref.actor.profiler.tool_config.npu.analysis=True",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
        "actor_rollout_ref.ref.profiler.enable=True",
        "actor_rollout_ref.ref.profiler.all_ranks=True",
        "actor_rollout_ref.ref.profiler.tool_config.npu.discrete=False",
        "actor_rollout_ref.ref.profiler.tool_config.npu.contents=['npu','cpu']",
        "actor_rollout_ref.ref.profiler.tool_config.npu.level=level0",
        "actor_rollout_ref.ref.profiler.tool_config.npu.analysis=True",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=1",
        "global_profiler.tool=npu",
        "global_profiler.steps=[2,4]",
        "global_profiler.save_path=/data/profile_data",
    ],
    # examples/profile/run_qwen2_5_vl_7b_torch_memory.sh
    "torch_memory": [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.name=sglang",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=1",
        "global_profiler.tool=torch_memory",
        "global_profiler.save_path=./mem_snapshots",
        "global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries=100000",
        "global_profiler.global_tool_config.torch_memory.stack_depth=32",
    ],
}
WORLD = 8


@pytest.fixture(scope="module")
def composed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each script's config, composed by Hydra from verl's own trainer YAML: the file as Hydra
    saves it (interpolations unresolved), and the DictConfig verl's workers get (resolved)."""
    pytest.importorskip("hydra", reason="the verl tests need hydra-core (pip install hydra-core)")
    pytest.importorskip("verl.utils.profiler", reason="the verl tests need verl==0.9.1")
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    folder = tmp_path_factory.mktemp("verl")
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    out: dict[str, Any] = {}
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        for name, overrides in SCRIPTS.items():
            cfg = compose(config_name="ppo_trainer", overrides=overrides)
            path = folder / f"{name}.yaml"
            path.write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")
            OmegaConf.resolve(cfg)  # as verl's main_ppo does before it builds the workers
            out[name] = (path, cfg)
    return out


def _verl_profiler(cfg: Any, key: str, rank: int) -> Any:
    """The DistProfiler a verl worker builds from the block ``key`` (engine_workers.py)."""
    from omegaconf import OmegaConf
    from verl.utils import omega_conf_to_dataclass
    from verl.utils.profiler import DistProfiler, ProfilerConfig

    omega = OmegaConf.select(cfg, key)
    config = omega_conf_to_dataclass(omega, dataclass_type=ProfilerConfig)
    tool = omega.get("tool")
    tool_config = omega_conf_to_dataclass(omega.tool_config.get(tool)) if tool else None
    return DistProfiler(rank=rank, config=config, tool_config=tool_config, save_file_prefix="x")


def _verl_records(cfg: Any, key: str, rank: int) -> tuple[bool, bool, bool]:
    """(records on this rank, at the planned steps, discrete) as verl's profiler decides."""
    prof = _verl_profiler(cfg, key, rank)
    planned = bool(prof.check_enable() and prof.check_this_rank())
    if prof._tool == "torch_memory":  # the out-of-memory watcher ignores `enable`
        return prof._impl._should_profile_this_rank(), planned, False
    return planned, planned, prof.is_discrete_mode()


@pytest.mark.slow
@pytest.mark.parametrize("script", list(SCRIPTS))
def test_script_converts_to_what_verl_records(
    script: str, composed: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from npu_fixtures import installed_fake
    from omegaconf import OmegaConf

    monkeypatch.chdir(tmp_path)
    path, cfg = composed[script]
    out = tmp_path / "policy.yaml"
    assert main(["from-verl", str(path), "-o", str(out)]) == 0
    assert main(["validate", str(out)]) == 0
    capsys.readouterr()
    policy = load_policy(out)
    tool = OmegaConf.select(cfg, "global_profiler.tool")
    backend = {"torch": "torch", "npu": "mstx", "torch_memory": "memory"}[tool]
    save = OmegaConf.select(cfg, "global_profiler.save_path")
    assert policy.output_dir == os.path.normpath(os.path.join(tmp_path, save))
    steps = set(OmegaConf.select(cfg, "global_profiler.steps") or [])
    blocks = {"actor": "actor_rollout_ref.actor.profiler", "ref": "actor_rollout_ref.ref.profiler"}
    # verl.trainer.ppo.utils.need_critic (its module needs `datasets`, which the tests leave out)
    critic = cfg.critic.enable
    if critic or (critic is None and cfg.algorithm.adv_estimator == "gae"):
        blocks["critic"] = "critic.profiler"
    with installed_fake() if tool == "npu" else contextlib.nullcontext():
        for role, key in blocks.items():
            spec = policy.role(role)
            assert _verl_profiler(cfg, key, 0)._tool == tool
            for rank in range(WORLD):
                records, planned, discrete = _verl_records(cfg, key, rank)
                plan = compile_plan(policy, role, Topology(rank=rank, world=WORLD))
                assert plan.enabled == records, (role, rank)
                if records:
                    assert spec.backends == (backend,)
                    assert spec.discrete == discrete
                    assert [s for s in range(12) if s in spec.steps] == (
                        [s for s in range(12) if s in steps] if planned else [])
        _check_rollout(script, cfg, policy)


def _check_rollout(script: str, cfg: Any, policy: Any) -> None:
    """verl profiles a replica's engine when its DistProfiler (ranks read as the replicas
    that hold them) is enabled, selects it and is discrete; each rank of such a replica is
    the policy's."""
    from omegaconf import OmegaConf
    from verl.utils import omega_conf_to_dataclass
    from verl.utils.profiler import build_rollout_dist_profiler

    rollout = OmegaConf.select(cfg, "actor_rollout_ref.rollout")
    config = omega_conf_to_dataclass(rollout.profiler)
    size = (rollout.tensor_model_parallel_size * rollout.data_parallel_size
            * rollout.pipeline_model_parallel_size)
    tool = config.tool
    if tool not in ("torch", "npu"):  # the servers build no profiler for other tools
        assert not policy.role("rollout").enabled
        return
    for replica in range(WORLD // size):
        tool_config = omega_conf_to_dataclass(rollout.profiler.tool_config.get(tool))
        prof = build_rollout_dist_profiler(replica, size, config=config, tool_config=tool_config)
        verl_records = prof.check_enable() and prof.check_this_rank() and prof.is_discrete_mode()
        if tool == "npu":  # vLLM-Ascend's profiler: no engine backend, listed instead
            assert not policy.role("rollout").enabled
            continue
        for rank in range(replica * size, (replica + 1) * size):
            plan = compile_plan(policy, "rollout", Topology(rank=rank, world=WORLD))
            assert plan.enabled == verl_records, (script, replica, rank)


@pytest.mark.slow
@pytest.mark.parametrize("script", list(SCRIPTS))
def test_interpolations_resolve_as_omegaconf_resolves_them(script: str,
                                                          composed: dict[str, Any]) -> None:
    from omegaconf import OmegaConf

    from policy_engine.language.read.source import read_document

    path, cfg = composed[script]
    resolver = Resolver(read_document(path).data)
    for key in ("global_profiler", "trainer", "actor_rollout_ref.actor.profiler",
                "actor_rollout_ref.ref.profiler", "actor_rollout_ref.rollout.profiler",
                "critic.profiler"):
        assert resolver.get(key) == OmegaConf.to_container(OmegaConf.select(cfg, key)), key


@pytest.mark.slow
def test_npu_rollout_engines_are_listed(composed: dict[str, Any], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = composed["npu_discrete"]
    assert main(["from-verl", str(path), "-o", str(tmp_path / "p.yaml")]) == 0
    assert capsys.readouterr().err == (
        "policy-engine from-verl: no equivalent: actor_rollout_ref.rollout.profiler: verl's npu "
        "profiler inside the rollout engine (actor_rollout_ref.rollout.name=vllm) has no policy "
        "backend (the engine backends record with torch in vLLM and SGLang); role 'rollout' is "
        "off\n")


def test_validate_knows_the_roles_verl_workers_are_profiled_as() -> None:
    """validate's misspelling warning reads the language's copy of the plugin's table."""
    from policy_engine.integrations.verl import roles as verl_roles
    from policy_engine.language.rules.role_names import VERL_ROLES

    table = {role for role, together in verl_roles.WORKERS.values() for role in
             (role, *together)} | {verl_roles.UNNAMED}
    assert sorted(VERL_ROLES) == sorted(table)


def _shipped_trainer() -> Path:
    pytest.importorskip("hydra", reason="the verl tests need hydra-core (pip install hydra-core)")
    pytest.importorskip("verl.utils.profiler", reason="the verl tests need verl==0.9.1")
    import verl

    return Path(verl.__file__).parent / "trainer" / "config" / "ppo_trainer.yaml"


def test_verls_shipped_trainer_yaml_is_composed_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's own ppo_trainer.yaml (a defaults: list) converts to what Hydra's composition
    of it converts to, --set applied after; as it ships it profiles nothing, and the
    warning says so."""
    trainer = _shipped_trainer()
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    monkeypatch.chdir(tmp_path)
    sets = ["global_profiler.tool=torch", "global_profiler.steps=[2,3]",
            f"{ACTOR}.enable=True", f"{ACTOR}.ranks=[0,3]"]
    out = tmp_path / "p.yaml"
    assert main(["from-verl", str(trainer), "-o", str(out),
                 *(arg for text in sets for arg in ("--set", text))]) == 0
    assert capsys.readouterr().err == ""
    with initialize_config_dir(config_dir=str(trainer.parent), version_base=None):
        composed = OmegaConf.to_container(compose(config_name="ppo_trainer"), resolve=False)
    import yaml

    expected = convert_mapping(composed, sets).policy
    assert yaml.safe_load(out.read_text(encoding="utf-8")) == expected
    assert load_policy(out).role("actor").enabled
    assert main(["from-verl", str(trainer), "-o", str(out), "--force"]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"wrote {out}\n"
    assert captured.err.endswith("warning: no role is enabled: the policy profiles nothing "
                                 "(set enabled: true on a role under roles, or in defaults) "
                                 "(at $.roles)\n")


def test_a_config_hydra_cannot_compose_is_unreadable(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    _shipped_trainer()
    cfg = tmp_path / "trainer.yaml"
    cfg.write_text(UNCOMPOSED, encoding="utf-8")  # no actor/ group beside it
    assert main(["from-verl", str(cfg), "-o", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"policy-engine from-verl: error: Hydra cannot compose {cfg}: "
                          "MissingConfigException: ")
