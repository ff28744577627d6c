"""Checks the schema cannot express: selectors, schedules, names, cross-field rules.

Section checks run on every ``defaults`` / ``roles.<role>`` block whatever else is wrong,
so one run reports every problem; role checks run on each role's merged settings once the
sections are sound.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from . import backends
from ._frozen import deep_merge
from .errors import Problem, Severity, json_path
from .loader import Document
from .model import BUILTIN_DEFAULTS, RoleSpec, build_role
from .naming import NameTemplate, TemplateError
from .schedule import Schedule, ScheduleError
from .selectors import RankSelector, SelectorError, StepSet
from .topology import Topology, format_mesh, mesh_size

Path = tuple[str | int, ...]


class _Sink:
    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self.problems: list[Problem] = []

    def add(self, message: str, path: Sequence[str | int], severity: Severity = "error",
            *, key: bool = False) -> None:
        self.problems.append(
            Problem(message, json_path(path), self.doc.locate(path, key=key), severity))

    @property
    def has_errors(self) -> bool:
        return any(p.severity == "error" for p in self.problems)


def _sections(data: Mapping[str, Any]) -> Iterator[tuple[Path, Mapping[str, Any]]]:
    if isinstance(data.get("defaults"), Mapping):
        yield ("defaults",), data["defaults"]
    roles = data.get("roles")
    if isinstance(roles, Mapping):
        for name, body in roles.items():
            if isinstance(body, Mapping):
                yield ("roles", name), body


def _check_section(sink: _Sink, path: Path, body: Mapping[str, Any]) -> None:
    if "ranks" in body:
        try:
            RankSelector.parse(body["ranks"])
        except SelectorError as err:
            sink.add(err.message, (*path, "ranks", *err.path))
    if "steps" in body:
        try:
            StepSet.parse(body["steps"])
        except SelectorError as err:
            sink.add(err.message, (*path, "steps", *err.path))
    if isinstance(body.get("name"), str):
        try:
            NameTemplate.parse(body["name"])
        except TemplateError as err:
            sink.add(f"bad name template: {err.message} (at character {err.offset + 1})",
                     (*path, "name"))
    for backend in backends.BACKENDS:
        block = body.get(backend)
        if isinstance(block, Mapping):
            merged = deep_merge(BUILTIN_DEFAULTS[backend], block)
            for message, sub in backends.check_settings(backend, merged):
                # Point at the key the user wrote, or at the block when it came from defaults.
                where = (*path, backend, *sub) if sub and sub[0] in block else (*path, backend)
                sink.add(message, where)


def _origin(data: Mapping[str, Any], role: str | None, field: str) -> Path:
    """Where the value a merged role uses for ``field`` was written."""
    if role is not None:
        body = (data.get("roles") or {}).get(role) or {}
        if field in body:
            return ("roles", role, field)
    if field in (data.get("defaults") or {}):
        return ("defaults", field)
    return ("roles", role) if role is not None else ("defaults",)


def _merged(data: Mapping[str, Any], role: str | None) -> dict[str, Any]:
    merged = deep_merge(BUILTIN_DEFAULTS, data.get("defaults") or {})
    if role is not None:
        merged = deep_merge(merged, (data.get("roles") or {}).get(role) or {})
    return merged


def _check_schedules(sink: _Sink, data: Mapping[str, Any], role: str | None,
                     raw: Mapping[str, Any]) -> None:
    items: list[tuple[Path, Any]] = [(_origin(data, role, "schedule"), raw.get("schedule"))]
    regions = raw.get("regions")
    if isinstance(regions, Mapping):
        base = _origin(data, role, "regions")
        for name, body in regions.items():
            if isinstance(body, Mapping) and body.get("schedule") is not None:
                items.append(((*base, name, "schedule"), body["schedule"]))
                if not raw.get("discrete"):
                    sink.add(f"region {name!r} has its own schedule, which applies only "
                             "with discrete: true", (*base, name, "schedule"), "warning")
    for where, sched in items:
        if isinstance(sched, Mapping):
            if "active" not in sched:
                sink.add("a schedule needs active >= 1", where)
                continue
            try:
                Schedule.from_mapping(sched)
            except ScheduleError as err:
                sink.add(err.message, (*where, *err.path))


def _one_run(steps: StepSet) -> bool:
    """Whether merge_steps turns ``steps`` into a single capture (one consecutive run)."""
    first, last, count = steps.first(), steps.last(), steps.count()
    return first is not None and last is not None and count == last - first + 1


def _captures_per_rank(spec: RoleSpec) -> list[tuple[str, str]]:
    """(field, why) pairs: what a name needs to tell one rank's captures apart."""
    needs: list[tuple[str, str]] = []
    count = spec.steps.count()
    if (count is None or count > 1) and (spec.discrete or not (
            spec.merge_steps and _one_run(spec.steps))):
        needs.append(("step", f"it profiles steps {spec.steps} as separate captures"))
    schedules = [spec.schedule]
    if spec.discrete:
        enabled = [r for r in spec.regions if r.enabled]
        if len(enabled) > 1:
            needs.append(("region", "each region call is its own capture (discrete: true)"))
        schedules += [r.schedule for r in enabled if r.own_schedule]
    for sched in schedules:
        if sched is not None and sched.cycles != 1:
            times = "without end (repeat: 0)" if sched.cycles is None else f"{sched.cycles} times"
            needs.append(("cycle", f"its schedule repeats {times} within a capture"))
            break
    return needs


def _check_names(sink: _Sink, data: Mapping[str, Any], spec: RoleSpec,
                 world: int | None, mesh: Mapping[str, int] | None) -> None:
    where = _origin(data, spec.name if spec.name in (data.get("roles") or {}) else None, "name")
    fields = spec.template.fields()
    for field, why in _captures_per_rank(spec):
        if field not in fields:
            sink.add(f"the name cannot tell apart the captures of one rank of role "
                     f"{spec.name!r}: {why}, but the name has no <{field}>", where)
    rank_fields = fields & {"rank", "local_rank", "node", "tp", "pp", "dp", "cp", "ep"}
    if "rank" in fields or {"node", "local_rank"} <= fields:
        return
    if world is None:
        single = spec.ranks.clauses and len(spec.ranks.clauses) == 1 and isinstance(
            spec.ranks.to_json(), int)
        if not single:
            sink.add(f"the name cannot tell apart the ranks role {spec.name!r} may profile: "
                     "add <rank>", where)
        return
    seen: dict[tuple[str, ...], int] = {}
    for rank in range(world):
        topo = Topology.for_rank(rank, world, mesh or None)
        if not spec.ranks.matches(rank, world, topo.selector_coords(), topo.selector_sizes()):
            continue
        values = topo.selector_coords()
        values["rank"] = rank
        key = tuple(spec.template.render({f: values.get(f) for f in rank_fields}).split("/"))
        if key in seen:
            sink.add(f"the name cannot tell apart ranks {seen[key]} and {rank} of role "
                     f"{spec.name!r}: add <rank>", where)
            return
        seen[key] = rank


def _check_role(sink: _Sink, data: Mapping[str, Any], role: str | None,
                world: int | None, mesh: Mapping[str, int] | None) -> None:
    raw = _merged(data, role)
    label = role or "defaults"
    _check_schedules(sink, data, role, raw)
    if sink.has_errors:
        return
    spec = build_role(role or "<any role>", data.get("defaults") or {},
                      (data.get("roles") or {}).get(role) if role else None)
    if not spec.enabled:
        return
    if spec.discrete and spec.merge_steps:
        sink.add("discrete: true cannot be combined with merge_steps: true "
                 "(each region call is its own capture)", _origin(data, role, "merge_steps"))
    sizes = dict(mesh or {})
    problems = spec.ranks.check(world, sizes if mesh else None)
    for err in problems:
        sink.add(err.message, (*_origin(data, role, "ranks"), *err.path))
    if spec.ranks.selects_nothing:
        sink.add(f"ranks: [] selects no rank: role {label!r} never profiles",
                 _origin(data, role, "ranks"), "warning")
    if spec.steps.is_empty:
        sink.add(f"role {label!r} is enabled but its steps select none",
                 _origin(data, role, "steps"), "warning")
    elif not spec.steps.is_bounded and not (
            spec.merge_steps and spec.schedule is not None and spec.schedule.cycles):
        sink.add(f"role {label!r} records every training step (steps: {spec.steps}): a long "
                 "run writes a trace per step; give a list or a range",
                 _origin(data, role, "steps"), "warning")
    if not problems:
        _check_names(sink, data, spec, world, mesh)


def check_document(doc: Document, *, world: int | None = None,
                   mesh: Mapping[str, int] | None = None,
                   structure_ok: bool = True) -> list[Problem]:
    """Problems beyond the schema. ``mesh`` (the CLI's ``--mesh``) overrides the policy's.

    With ``structure_ok`` false (the schema failed) only section checks run.
    """
    sink = _Sink(doc)
    data = doc.data
    for path, body in _sections(data):
        _check_section(sink, path, body)
    policy_mesh = data.get("mesh") if isinstance(data.get("mesh"), Mapping) else None
    if mesh is not None and policy_mesh and dict(policy_mesh) != dict(mesh):
        sink.add(f"--mesh {format_mesh(mesh)} replaces the policy's mesh "
                 f"{format_mesh(policy_mesh)}", ("mesh",), "warning")
    mesh = mesh or policy_mesh
    if mesh and all(isinstance(v, int) and v >= 1 for v in mesh.values()):
        if world is not None and mesh_size(mesh) != world:
            sink.add(f"mesh {format_mesh(mesh)} has {mesh_size(mesh)} ranks but the world "
                     f"has {world}", ("mesh",))
        world = world if world is not None else mesh_size(mesh)
    if not structure_ok or sink.has_errors:
        return sink.problems
    if (data.get("defaults") or {}).get("enabled"):
        _check_role(sink, data, None, world, mesh)
    for role in data.get("roles") or {}:
        _check_role(sink, data, role, world, mesh)
    return sink.problems
