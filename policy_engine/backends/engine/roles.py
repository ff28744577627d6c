"""What a role driven through an engine may ask for, whichever the engine: the checks the
vllm and sglang ``checks`` modules share (pure Python: validate runs them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policy_engine.backends.engine.layout import ENGINE_DIMS, partial_replicas, world_of
from policy_engine.language.mesh import coords_from_mesh, format_mesh

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


def schedule_problem(engine: str, spec: Any, allowed: str) -> list[RoleProblem]:
    """The problem of a schedule the engine maps only in part (``allowed`` says how)."""
    return [(f"{engine} cannot follow this schedule: {allowed}", "schedule", "error")]


def version_tuple(text: str) -> tuple[int, ...]:
    """``0.5.23`` -> (0, 5, 23); a part that is no number ends the tuple."""
    out = []
    for part in text.split("."):
        digits = "".join(ch for ch in part if ch.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        out.append(int(digits))
        if digits != part:
            break
    return tuple(out)


def absolute_dir(settings: Mapping[str, Any], key: str,
                 engine: str) -> list[tuple[str, tuple[str | int, ...]]]:
    value = settings[key]
    if value and not str(value).startswith("/"):
        return [(f"{key} {value!r} is relative: the {engine} engine resolves it in its own "
                 "working directory, which the driver does not know; give an absolute path "
                 "(or leave it empty: <output_dir>/<role>/.engine)", (key,))]
    return []
