"""Checks the schema cannot express: selectors, schedules, names, cross-field rules.

Section checks run on every ``defaults`` / ``roles.<role>`` block whatever else is wrong,
so one run reports every problem; a value the schema rejects is left to the schema's
message. Role checks run on each role's merged settings when the blocks it is built from
are sound; a problem that several roles share (a value in ``defaults``) is reported once,
naming every role it affects.
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
from .schema import fits
from .selectors import RankSelector, SelectorError, StepSet
from .topology import DIMS, Topology, coords_from_mesh, format_mesh, mesh_size

Path = tuple[str | int, ...]
#: The role name that stands for roles the policy does not name (they get ``defaults``).
UNNAMED = ""


class _Sink:
    """Problems in the order found; the same problem is kept once, with every role named."""

    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self._found: dict[tuple[str, Path, Severity], list[str]] = {}

    def add(self, message: str, path: Sequence[str | int], severity: Severity = "error",
            *, role: str | None = None) -> None:
        """Record a problem. With ``role``, ``message`` holds ``{who}``, filled in with every
        role the same problem was found for (:data:`UNNAMED` for the unnamed ones)."""
        roles = self._found.setdefault((message, tuple(path), severity), [])
        if role is not None and role not in roles:
            roles.append(role)

    def errors_under(self, *prefixes: Path) -> bool:
        return any(sev == "error" and any(path[: len(p)] == p for p in prefixes)
                   for (_, path, sev) in self._found)

    def problems(self) -> list[Problem]:
        return [Problem(message.format(who=_who(roles)) if roles else message,
                        json_path(path), self.doc.locate(path), severity)
                for (message, path, severity), roles in self._found.items()]


def _who(roles: Sequence[str]) -> str:
    """``role 'a'``, ``roles 'a' and 'b'``, ``role 'a' and any role not named under roles``."""
    named = [repr(r) for r in roles if r != UNNAMED]
    unnamed = ["any role not named under roles"] if UNNAMED in roles else []
    items = named + unnamed
    text = items[-1] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
    if not named:
        return text
    return f"role{'s' if len(named) > 1 else ''} {text}"


def _sections(data: Mapping[str, Any]) -> Iterator[tuple[Path, Mapping[str, Any]]]:
    if isinstance(data.get("defaults"), Mapping):
        yield ("defaults",), data["defaults"]
    roles = data.get("roles")
    if isinstance(roles, Mapping):
        for name, body in roles.items():
            if isinstance(body, Mapping):
                yield ("roles", name), body


def _check_section(sink: _Sink, path: Path, body: Mapping[str, Any]) -> None:
    """Checks of one block's own values, in the order the block lists them."""
    for key, value in body.items():
        if key in ("ranks", "steps") and fits(value, "$defs", key):
            try:
                (RankSelector if key == "ranks" else StepSet).parse(value)
            except SelectorError as err:
                sink.add(err.message, (*path, key, *err.path))
        elif key == "name" and isinstance(value, str) and value:
            try:
                NameTemplate.parse(value)
            except TemplateError as err:
                sink.add(f"bad name template at character {err.offset + 1}: {err.message}",
                         (*path, key))
        elif key in backends.BACKENDS and isinstance(value, Mapping) and fits(
                value, "$defs", key):
            merged = deep_merge(BUILTIN_DEFAULTS[key], value)
            for message, sub in backends.check_settings(key, merged):
                # Point at the key the user wrote, or at the block when it came from defaults.
                where = (*path, key, *sub) if sub and sub[0] in value else (*path, key)
                sink.add(message, where)


def origin(data: Mapping[str, Any], role: str, field: str) -> Path:
    """Where the value a merged role uses for ``field`` was written (the role itself when
    the value is a built-in default)."""
    if role != UNNAMED:
        body = (data.get("roles") or {}).get(role) or {}
        if field in body:
            return ("roles", role, field)
    if field in (data.get("defaults") or {}):
        return ("defaults", field)
    return ("roles", role) if role != UNNAMED else ("defaults",)


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
        needs.append(("step", f"steps {spec.steps} are separate captures"))
    schedules = [spec.schedule]
    if spec.discrete:
        enabled = [r for r in spec.regions if r.enabled]
        if len(enabled) > 1:
            needs.append(("region", "each region call is its own capture (discrete: true)"))
        schedules += [r.schedule for r in enabled if r.own_schedule]
    for sched in schedules:
        if sched is not None and sched.cycles != 1:
            times = "without end (repeat: 0)" if sched.cycles is None else f"{sched.cycles} times"
            needs.append(("cycle", f"the schedule repeats {times} within a capture"))
            break
    return needs


def _single_rank(ranks: RankSelector) -> bool:
    """Whether ``ranks`` selects at most one rank whatever the world size."""
    return len(ranks.clauses) == 1 and isinstance(ranks.to_json(), int)


def _check_names(sink: _Sink, data: Mapping[str, Any], spec: RoleSpec, role: str,
                 world: int | None, mesh: Mapping[str, int] | None) -> None:
    where = origin(data, role, "name")
    fields = spec.template.fields()
    # nsys numbers the reports of one process itself (X.1.nsys-rep, X.2...), so for nsight
    # only the ranks need telling apart.
    per_rank = [] if spec.backend == "nsight" else _captures_per_rank(spec)
    for field, why in per_rank:
        if field not in fields:
            sink.add(f"the name cannot tell apart the captures one rank makes for {{who}}: "
                     f"{why}; add <{field}>", where, role=role)
    if "rank" in fields or {"node", "local_rank"} <= fields:
        return
    if world is None:
        if not _single_rank(spec.ranks):
            sink.add(f"the name cannot tell apart the ranks of {{who}} (ranks: {spec.ranks}); "
                     "add <rank>", where, role=role)
        return
    # Coordinates carry their label (tp1pp0), so names differ exactly when the coordinates
    # they show differ: comparing those is rendering every name without the cost. local_rank
    # or node alone repeat across nodes; pid, host and timestamp prove nothing.
    shown = [dim for dim in DIMS if dim in fields]
    sizes = Topology.for_rank(0, world, mesh or None).selector_sizes()
    seen: dict[tuple[int | None, ...], int] = {}
    for rank in range(world):
        coords = coords_from_mesh(rank, mesh) if mesh else {}
        if not spec.ranks.matches(rank, world, {**coords, "local_rank": rank, "node": 0},
                                  sizes):
            continue
        key = tuple(coords.get(dim) for dim in shown)
        if key in seen:
            sink.add(f"the name cannot tell apart ranks {seen[key]} and {rank} of {{who}}; "
                     "add <rank>", where, role=role)
            return
        seen[key] = rank


def _check_role(sink: _Sink, data: Mapping[str, Any], role: str,
                world: int | None, mesh: Mapping[str, int] | None) -> None:
    body = (data.get("roles") or {}).get(role) if role != UNNAMED else None
    spec = build_role(role or "defaults", data.get("defaults") or {}, body)
    if not spec.enabled:
        return
    if spec.discrete and spec.merge_steps:
        sink.add("discrete: true cannot be combined with merge_steps: true "
                 "(each region call is its own capture)", origin(data, role, "merge_steps"))
    if not spec.discrete:
        regions_at = origin(data, role, "regions")
        for region in spec.regions:
            if region.own_schedule:
                sink.add(f"region {region.name!r} has its own schedule, which only applies "
                         "with discrete: true", (*regions_at, region.name, "schedule"),
                         "warning")
    ranks_at = origin(data, role, "ranks")
    problems = spec.ranks.check(world, dict(mesh) if mesh else None)
    for err in problems:
        sink.add(err.message, (*ranks_at, *err.path))
    coord_dims = sorted({axis.dim for axes in spec.ranks.clauses for axis in axes}
                        & {"tp", "pp", "dp", "cp", "ep"})
    if coord_dims and not mesh:
        sink.add(f"ranks select by {', '.join(coord_dims)} but the policy has no mesh: these "
                 "coordinates must come from a DeviceMesh or Megatron at run time, else no "
                 "rank of {who} is profiled", ranks_at, "warning", role=role)
    if spec.ranks.selects_nothing:
        shown = "[]" if not spec.ranks.clauses else str(spec.ranks)
        sink.add(f"ranks: {shown} selects no rank: nothing is profiled for {{who}}", ranks_at,
                 "warning", role=role)
    steps_at = origin(data, role, "steps")
    if spec.steps.is_empty:
        sink.add("steps: [] selects no step: nothing is profiled for {who}", steps_at,
                 "warning", role=role)
    elif not spec.steps.is_bounded and not (
            spec.merge_steps and spec.schedule is not None and spec.schedule.cycles):
        sink.add(f"steps: {spec.steps} profiles every training step for {{who}}: a long run "
                 "writes a trace per step; list the steps or give a range such as '10-12'",
                 steps_at, "warning", role=role)
    if not (spec.ranks.selects_nothing or spec.steps.is_empty):
        _check_names(sink, data, spec, role, world, mesh)


def _check_mesh(sink: _Sink, data: Mapping[str, Any], world: int | None,
                mesh: Mapping[str, int] | None) -> tuple[int | None, Mapping[str, int] | None]:
    """The world size and mesh the role checks use (``mesh`` from ``--mesh`` wins)."""
    policy_mesh = data.get("mesh")
    if policy_mesh is not None and not fits(policy_mesh, "properties", "mesh"):
        policy_mesh = None  # the schema reports it
    if mesh is not None and policy_mesh and dict(policy_mesh) != dict(mesh):
        sink.add(f"--mesh {format_mesh(mesh)} replaces the policy's mesh "
                 f"{format_mesh(policy_mesh)}", ("mesh",), "warning")
    mesh = mesh or policy_mesh or None
    if mesh:
        if world is not None and mesh_size(mesh) != world:
            sink.add(f"mesh {format_mesh(mesh)} has {mesh_size(mesh)} ranks but the world "
                     f"has {world}", ("mesh",))
        world = world if world is not None else mesh_size(mesh)
    return world, mesh


def check_document(doc: Document, *, world: int | None = None,
                   mesh: Mapping[str, int] | None = None,
                   structure_ok: bool = True) -> list[Problem]:
    """Problems beyond the schema. ``mesh`` (the CLI's ``--mesh``) overrides the policy's.

    ``structure_ok`` false says the schema found errors: then each role is checked only
    when its own block and ``defaults`` are sound.
    """
    sink = _Sink(doc)
    data = doc.data
    for path, body in _sections(data):
        _check_section(sink, path, body)
    world, mesh = _check_mesh(sink, data, world, mesh)
    if sink.errors_under(("mesh",)):
        return sink.problems()
    defaults = data.get("defaults")
    if defaults is not None and not (structure_ok or fits(defaults, "$defs", "role")):
        return sink.problems()
    if sink.errors_under(("defaults",)):
        return sink.problems()
    roles = data.get("roles") or {}
    if not isinstance(roles, Mapping):
        return sink.problems()
    if isinstance(defaults, Mapping) and defaults.get("enabled"):
        _check_role(sink, data, UNNAMED, world, mesh)
    for role, body in roles.items():
        if not structure_ok and not fits({role: body}, "properties", "roles"):
            continue
        if not sink.errors_under(("roles", role)):
            _check_role(sink, data, role, world, mesh)
    return sink.problems()
