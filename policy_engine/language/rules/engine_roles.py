"""What a role driven through an inference engine may ask for: the checks of a whole role
whose backend is vllm or sglang (its schedule, ranks, mesh, regions), which validate runs
beside the settings checks of :mod:`policy_engine.settings`. Pure Python."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policy_engine.language.rules.engine_layout import ENGINE_DIMS, partial_replicas, world_of
from policy_engine.language.values.mesh import coords_from_mesh, format_mesh
from policy_engine.settings import sglang, vllm
from policy_engine.settings.engines import version_tuple

#: (message, the role key it is about, severity)
RoleProblem = tuple[str, str, str]


def _selected(spec: Any, mesh: Mapping[str, int]) -> list[int]:
    world = world_of(mesh)
    sizes = dict(mesh, local_rank=world, node=1)
    out = []
    for rank in range(world):
        coords = dict(coords_from_mesh(rank, mesh), local_rank=rank, node=0)
        if spec.ranks.matches(rank, world, coords, sizes):
            out.append(rank)
    return out


def _show(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")


def common(engine: str, spec: Any, mesh: Mapping[str, int] | None) -> list[RoleProblem]:
    """Problems of an enabled role whose backend is ``engine``, on its ``mesh``."""
    problems: list[RoleProblem] = []
    if len(spec.backends) > 1:
        problems.append((f"{engine} records inside the engine's processes; "
                         f"{', '.join(spec.backends[1:])} would record the driving process "
                         "instead: profile it in a role of its own", "backend", "error"))
    if spec.triggers.any:
        problems.append((f"triggers cannot reach a {engine} engine: the driver starts and "
                         "stops the engine at the planned steps only", "triggers", "error"))
    if not mesh:
        problems.append((f"the role has no mesh: policy-engine expects one {engine} rank "
                         "(tp=1) and checks the engine's files against that; give the "
                         "engine's parallelism as mesh, e.g. dp: 2, tp: 4", "mesh", "warning"))
        return problems
    extra = [dim for dim in mesh if dim not in ENGINE_DIMS]
    if extra:
        problems.append((f"mesh {format_mesh(mesh)}: {engine} names its files by "
                         f"{', '.join(ENGINE_DIMS)} only, not {', '.join(extra)}", "mesh",
                         "error"))
        return problems
    for replica, taken, left in partial_replicas(_selected(spec, mesh), mesh):
        problems.append((f"ranks select ranks {_show(taken)} of replica dp={replica} but not "
                         f"{_show(left)}: an engine profiles all ranks of a replica at "
                         "once; select whole replicas (for example ranks: {dp: 0})", "ranks",
                         "error"))
        break  # one example says it
    return problems


def _older(engine: str, settings: Mapping[str, Any], checked: str, what: str,
           key: str) -> list[RoleProblem]:
    """The warning for a ``version`` setting older than the release that was checked."""
    version = settings.get("version")
    if not version or version_tuple(version) >= version_tuple(checked):
        return []
    return [(f"{engine} {version} is older than {checked}, the version policy-engine was "
             f"checked against: {what}", key, "warning")]


def schedule_problem(engine: str, spec: Any, allowed: str) -> list[RoleProblem]:
    """The problem of a schedule the engine maps only in part (``allowed`` says how)."""
    return [(f"{engine} cannot follow this schedule: {allowed}", "schedule", "error")]


def vllm_role(spec: Any, mesh: Mapping[str, int] | None) -> list[RoleProblem]:
    """What an enabled role with this backend asks of vLLM that vLLM cannot do."""
    problems = common("vllm", spec, mesh)
    if spec.discrete:
        problems.append(("vLLM profiles whole engine iterations, not regions: discrete: "
                         "true has nothing to capture", "discrete", "error"))
    schedule = spec.schedule
    if schedule is not None:
        if schedule.repeat != 1:
            problems += schedule_problem(
                "vLLM", spec, f"repeat: {schedule.repeat}; vLLM's profiler schedule "
                "records one cycle (repeat: 1) per start_profile")
        if schedule.skip_first_wait:
            problems += schedule_problem(
                "vLLM", spec, "skip_first_wait; vLLM waits wait_iterations every time")
    return problems + _older("vLLM", spec.settings, vllm.CHECKED_VERSION,
                             "start_profile(profile_prefix, delay_iterations=, "
                             "max_iterations=, profiler_kwargs=) and the rank-qualified file "
                             "names may differ there", "vllm")


_ONLY_ACTIVE = ("only {active: N, repeat: 1} maps onto SGLang (num_steps: N); start_step "
                "counts the engine's forward passes since it started, which the driver cannot "
                "see, SGLang has no warm-up and records one cycle")


def sglang_role(spec: Any, mesh: Mapping[str, int] | None) -> list[RoleProblem]:
    """What an enabled role with this backend asks of SGLang that SGLang cannot do."""
    problems = common("sglang", spec, mesh)
    settings = spec.settings
    schedule = spec.schedule
    if schedule is not None and (schedule.skip_first or schedule.skip_first_wait or
                                 schedule.wait or schedule.warmup or schedule.repeat != 1):
        problems += schedule_problem("SGLang", spec, _ONLY_ACTIVE)
    names = [r.name for r in spec.regions if r.enabled]
    if settings["profile_by_stage"]:
        if schedule is None:
            problems.append(("profile_by_stage needs schedule {active: N, repeat: 1}: SGLang "
                             "stops each stage after num_steps forward passes", "sglang",
                             "error"))
        if not spec.discrete or not names or any(n not in sglang.STAGES for n in names):
            problems.append(("profile_by_stage writes a trace per stage: give discrete: true "
                             "and regions [extend, decode] (the stages, named by <region>)",
                             "sglang", "error"))
        if any(r.own_schedule for r in spec.regions):
            problems.append(("the stages share one num_steps: regions cannot have their own "
                             "schedule", "regions", "error"))
    elif spec.discrete:
        problems.append(("SGLang profiles whole forward passes: discrete: true needs "
                         "profile_by_stage: true (regions extend and decode)", "discrete",
                         "error"))
    if "MEM" in settings["activities"] and mesh and (mesh.get("pp", 1) > 1 or
                                                     mesh.get("ep", 1) > 1):
        problems.append(("SGLang names memory snapshots by TP rank only: ranks of different "
                         "PP or EP stages would overwrite each other's; leave MEM out",
                         "sglang", "error"))
    return problems + _older("SGLang", settings, sglang.CHECKED_VERSION,
                             "its request may be ProfileReqInput and lack profile_prefix, "
                             "which keeps replicas' files apart", "sglang")


_ROLE_CHECKS = {"vllm": vllm_role, "sglang": sglang_role}


def check_role(backend: str, spec: Any, mesh: Mapping[str, int] | None) -> list[RoleProblem]:
    """What ``backend`` (a registry name) cannot do of an enabled role as a whole: (message,
    the role key at fault, severity). Backends that run in the profiled process can do all
    of it."""
    found = _ROLE_CHECKS.get(backend)
    return [] if found is None else found(spec, mesh)
