"""Cross-field rules on the built roles: what no single value can say.

Mesh against world size, each enabled role's selectors against the mesh, whether its
names tell apart every rank and capture, mode conflicts, and colocation
(:mod:`policy_engine.language.rules.colocation`). They run on the roles
:func:`policy_engine.language.model.build` could build, so a value the schema or a parse
refused is reported once, by them. A role with a refused value is still checked on what
it holds that is sound (its ranks against the world and the mesh, at least): every
problem is reported in one run. A problem that several roles share (a value in
``defaults``) is reported once, naming every role it affects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from policy_engine import settings as registry
from policy_engine.errors import Problem, Severity, json_path
from policy_engine.language.model import Built, RoleSpec
from policy_engine.language.read.document import Document
from policy_engine.language.rules import clash, colocation, role_names
from policy_engine.language.rules.engine_roles import check_role
from policy_engine.language.values.frozen import FrozenDict
from policy_engine.language.values.mesh import DIMS, effective_mesh, format_mesh, mesh_size
from policy_engine.language.values.ranks import RankSelector
from policy_engine.language.values.steps import StepSet, step_per_cycle

Path = tuple[str | int, ...]
#: The role name that stands for roles the policy does not name (they get ``defaults``).
UNNAMED = ""
#: The code of the warning that ranks select by coordinates while the policy has no mesh:
#: whether it matters depends on where a process runs (the runtime knows, validate not).
COORDINATES_WITHOUT_MESH = "coordinates-without-mesh"


class _Sink:
    """Problems in the order found; the same problem is kept once, with every role named."""

    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self._found: dict[tuple[str, Path, Severity, str | None], list[str]] = {}

    def add(self, message: str, path: Sequence[str | int], severity: Severity = "error",
            *, role: str | None = None, code: str | None = None) -> None:
        """Record a problem. With ``role``, ``message`` holds ``{who}``, filled in with every
        role the same problem was found for (:data:`UNNAMED` for the unnamed ones)."""
        roles = self._found.setdefault((message, tuple(path), severity, code), [])
        if role is not None and role not in roles:
            roles.append(role)

    @property
    def errors(self) -> bool:
        return any(severity == "error" for (_, _, severity, _) in self._found)

    def problems(self) -> list[Problem]:
        return [Problem(message.format(who=_who(roles)) if roles else message,
                        json_path(path), self.doc.locate(path), severity, code)
                for (message, path, severity, code), roles in self._found.items()]


def _literal(text: str) -> str:
    """``text`` inside a message that is formatted later with ``{who}``."""
    return text.replace("{", "{{").replace("}", "}}")


def _who(roles: Sequence[str]) -> str:
    """``role 'a'``, ``roles 'a' and 'b'``, ``role 'a' and any role not named under roles``."""
    named = [repr(r) for r in roles if r != UNNAMED]
    unnamed = ["any role not named under roles"] if UNNAMED in roles else []
    items = named + unnamed
    text = items[-1] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
    if not named:
        return text
    return f"role{'s' if len(named) > 1 else ''} {text}"


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
    first, last = steps.first(), steps.last()
    if first is not None and not steps.is_bounded:  # one endless run: every step from first
        return steps.every_step_from() == first
    return first is not None and last is not None and steps.run_end(first) == last


def _captures_per_rank(spec: RoleSpec) -> list[tuple[tuple[str, ...], str]]:
    """(fields, why) pairs: what a name needs to tell one rank's captures apart (any one
    of ``fields``)."""
    needs: list[tuple[tuple[str, ...], str]] = []
    if spec.triggers.any:
        needs.append((("step", "timestamp"),
                      "triggers open captures at steps the plan does not list"))
    count = spec.steps.count()  # None: unbounded or too intricate to count; many either way
    if (count is None or count > 1) and (spec.discrete or not (
            spec.merge_steps and _one_run(spec.steps))):
        needs.append((("step",), f"steps {spec.steps} are separate captures"))
    schedules = [spec.schedule]
    if spec.discrete:
        enabled = [r for r in spec.regions if r.enabled]
        if len(enabled) > 1:
            needs.append((("region",), "each region call is its own capture (discrete: true)"))
        schedules += [r.schedule for r in enabled if r.own_schedule]
    for sched in schedules:
        if sched is not None and sched.cycles != 1:
            times = "without end (repeat: 0)" if sched.cycles is None else f"{sched.cycles} times"
            # In a merged capture <step> renders each cycle's own outer step.
            merged = step_per_cycle(spec.steps, merge_steps=spec.merge_steps,
                                    schedule=spec.schedule, discrete=spec.discrete)
            needs.append((("cycle", "step") if merged else ("cycle",),
                          f"the schedule repeats {times} within a capture"))
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
    # for nsight only the ranks need telling apart (memory snapshots beside it do not)
    per_rank = [] if spec.backends == ("nsight",) else _captures_per_rank(spec)
    for needed, why in per_rank:
        if not fields.intersection(needed):
            add = " or ".join(f"<{field}>" for field in needed)
            sink.add(f"the name cannot tell apart the captures one rank makes for {{who}}: "
                     f"{why}; add {add}", where, role=role)
    if "rank" in fields or {"node", "local_rank"} <= fields:
        return
    if world is None:
        if not _single_rank(spec.ranks):
            # The message is a format string ({who}): a mapping's braces must stay text.
            shown_ranks = _literal(str(spec.ranks))
            sink.add(f"the name cannot tell apart the ranks of {{who}} (ranks: {shown_ranks}); "
                     "add <rank>", where, role=role)
        return
    if mesh and mesh_size(mesh) != world:
        return  # _check_mesh reports the mismatch; the roles are not checked against it
    # Coordinates carry their label (tp1pp0), so names differ exactly when the coordinates
    # they show differ. local_rank or node alone repeat across nodes; pid, host and
    # timestamp prove nothing. The selected ranks are compared as boxes of the mesh's
    # coordinates, never rank by rank: a world of 10**11 ranks costs what 8 cost.
    sizes = list(mesh.values()) if mesh else [world]
    shown = [at for at, dim in enumerate(mesh or {}) if dim in fields and dim in DIMS]
    boxes = spec.ranks.boxes(world, mesh)
    if len(boxes) <= clash.MAX_BOXES:
        pair = clash.clash(boxes, sizes, shown)
    elif sum(clash.box_size(box) for box in boxes) <= clash.MAX_LISTED:
        pair = clash.clash_listed(boxes, sizes, shown)
    else:
        sink.add("cannot prove that the name tells apart the ranks of {who}: the ranks "
                 f"selector is too complex to check ({len(boxes)} blocks of ranks); add <rank>",
                 where, role=role)
        return
    if pair is not None:
        sink.add(f"the name cannot tell apart ranks {pair[0]} and {pair[1]} of {{who}}; "
                 "add <rank>", where, role=role)


def _check_role(sink: _Sink, data: Mapping[str, Any], role: str, spec: RoleSpec,
                world: int | None, mesh: Mapping[str, int] | None) -> None:
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
    _check_ranks(sink, data, role, spec, world, mesh)
    for message, key, severity in check_role(spec.backend, spec, mesh):
        sink.add(message.replace("{", "{{").replace("}", "}}"), origin(data, role, key),
                 "error" if severity == "error" else "warning", role=role)
    ranks_at = origin(data, role, "ranks")
    coord_dims = sorted({axis.dim for axes in spec.ranks.clauses for axis in axes}
                        & {"tp", "pp", "dp", "cp", "ep"})
    if coord_dims and not mesh:
        blocks = (data.get("roles") or {}).values()
        none = "neither the policy nor the role has a mesh" if any(
            isinstance(b, Mapping) and b.get("mesh") for b in blocks) else "the policy has no mesh"
        sink.add(f"ranks select by {', '.join(coord_dims)} but {none}: these "
                 "coordinates must come from a DeviceMesh or Megatron at run time, else no "
                 "rank of {who} is profiled", ranks_at, "warning", role=role,
                 code=COORDINATES_WITHOUT_MESH)
    if spec.ranks.selects_nothing:
        shown = "[]" if not spec.ranks.clauses else _literal(str(spec.ranks))
        sink.add(f"ranks: {shown} selects no rank: nothing is profiled for {{who}}", ranks_at,
                 "warning", role=role)
    steps_at = origin(data, role, "steps")
    if spec.steps.is_empty:
        if not spec.triggers.listens and not _keeps_history(spec):
            sink.add("steps: [] selects no step: nothing is profiled for {who}", steps_at,
                     "warning", role=role)
    elif spec.steps.every_step_from() is not None and spec.limits.captures is None and not (
            # one capture whose schedule records a bounded number of cycles, or cycles
            # spaced by wait/warm-up (torchtitan's profile_freq): not every step
            spec.merge_steps and spec.schedule is not None
            and (spec.schedule.cycles or spec.schedule.wait + spec.schedule.warmup)):
        sink.add(f"steps: {spec.steps} profiles every training step for {{who}}: a long run "
                 "writes a trace per step; list the steps or give a range such as '10-12'",
                 steps_at, "warning", role=role)
    _check_budget(sink, data, spec, role)
    if spec.keep == "summaries" and "torch" not in spec.backends:
        sink.add(f"keep: summaries keeps every trace of {{who}}: summaries are made of torch "
                 f"traces only, and its backend is {spec.backend_label}",
                 origin(data, role, "keep"), "warning", role=role)
    every = spec.steps.every_step_from()
    if spec.triggers.any and every is not None:
        sink.add(f"triggers add nothing to {{who}} from step {every} on: the plan already "
                 "covers every step (a capture whose schedule waits records nothing when "
                 "triggered); list the steps to plan, e.g. {{every: 100, from: 100}}",
                 origin(data, role, "triggers"), "warning", role=role)
    if not (spec.ranks.selects_nothing or (
            spec.steps.is_empty and not spec.triggers.any and not _keeps_history(spec))):
        _check_names(sink, data, spec, role, world, mesh)


def _keeps_history(spec: RoleSpec) -> bool:
    """Whether the role records allocator history from its first step (``memory:
    {history: always}``): with no step planned, its out-of-memory snapshots are output."""
    return any(spec.blocks[name].get("history") == "always" for name in spec.backends)


def _check_ranks(sink: _Sink, data: Mapping[str, Any], role: str, spec: RoleSpec,
                 world: int | None, mesh: Mapping[str, int] | None) -> None:
    """Each rank and coordinate the selector names against the world and the mesh."""
    if not spec.enabled:
        return
    ranks_at = origin(data, role, "ranks")
    for err in spec.ranks.check(world, dict(mesh) if mesh else None):
        sink.add(err.message, (*ranks_at, *err.path))


def _check_budget(sink: _Sink, data: Mapping[str, Any], spec: RoleSpec, role: str) -> None:
    """Warn when the plan alone opens more captures than ``limits.captures`` allows (an
    endless plan is what a limit is for: no warning)."""
    limit = spec.limits.captures
    if limit is None or not spec.steps.is_bounded:
        return
    if spec.merge_steps and not spec.discrete:
        lengths = spec.steps.run_lengths()
        planned = None if lengths is None else sum(lengths.values())
    else:
        planned = spec.steps.count()
    if planned is None:
        return
    regions = sum(r.enabled for r in spec.regions) if spec.discrete else 1
    planned *= regions
    each = f" ({regions} regions a step, each call its own)" if spec.discrete else ""
    if planned <= limit:
        return
    sink.add(f"steps: {spec.steps} open {planned} captures per process{each} but "
             f"limits.captures is {limit}: only the first {limit} are recorded for {{who}}",
             origin(data, role, "limits"), "warning", role=role)


def _check_mesh(sink: _Sink, data: Mapping[str, Any], built: Built, world: int | None,
                mesh: Mapping[str, int] | None) -> tuple[int | None, Mapping[str, int] | None]:
    """The world size and the top-level mesh the role checks start from (``mesh`` from
    ``--mesh`` wins; a mesh the schema refused is left out)."""
    policy_mesh = data.get("mesh") if built.refused.sound(("mesh",)) else None
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


def _role_layout(sink: _Sink, data: Mapping[str, Any], role: str, spec: RoleSpec,
                 world: int | None, top: Mapping[str, int] | None,
                 cli: Mapping[str, int] | None, world_given: bool,
                 ) -> tuple[int | None, Mapping[str, int] | None] | None:
    """The world size and mesh the checks of ``role`` use: ``--mesh``, else the role's own
    mesh, else the top-level one. None when that mesh does not cover the world (then the
    role is not checked against either; the mismatch is reported once, where it was
    written)."""
    own = dict(spec.mesh)
    where = origin(data, role, "mesh")
    if cli is not None:
        if own and list(own.items()) != list(cli.items()):
            sink.add(f"--mesh {format_mesh(cli)} replaces the mesh {format_mesh(own)} of "
                     "{who}", where, "warning", role=role)
        own = {}
    mesh = effective_mesh(cli, own, top)
    if not mesh:
        return world, None
    if world is None:
        return mesh_size(mesh), mesh
    if mesh_size(mesh) != world:
        if own:  # the top-level mesh's mismatch is reported at $.mesh
            whence = "" if world_given or top is None else \
                f" (the size of the top-level mesh {format_mesh(top)})"
            sink.add(f"mesh {format_mesh(own)} of {{who}} has {mesh_size(own)} ranks but the "
                     f"world has {world}{_literal(whence)}", where, role=role)
        return None
    return world, mesh


#: The keys of a role (or of ``defaults``) that the world-dependent checks read: its
#: mesh against the world, its ranks against both.
_WORLD_KEYS = frozenset({"enabled", "ranks", "mesh"})
#: The keys :func:`_check_role` reads, besides each backend's block: a role with a refused
#: key outside these (an unknown key, ``export``) is checked in full, beside the refused
#: key's own problem.
_ROLE_KEYS = _WORLD_KEYS | {"backend", "steps", "merge_steps", "schedule", "discrete",
                            "regions", "name", "triggers", "limits"}


def _in_file_order(built: Built, named: Mapping[str, Any]
                   ) -> list[tuple[str, RoleSpec, frozenset[str]]]:
    """Every role built whole (nothing left out) or in part (:attr:`Built.partial`), the
    unnamed roles first, then as ``roles:`` lists them."""
    found: dict[str, tuple[RoleSpec, frozenset[str]]] = {
        name: (spec, dropped) for name, spec, dropped in built.partial}
    if built.unnamed is not None:
        found[UNNAMED] = (built.unnamed, frozenset())
    found.update((name, (spec, frozenset())) for name, spec in built.roles.items())
    return [(name, *found[name]) for name in (UNNAMED, *named) if name in found]


def check(doc: Document, built: Built, *, world: int | None = None,
          mesh: Mapping[str, int] | None = None) -> list[Problem]:
    """Problems across values, in the built roles. ``mesh`` (the CLI's ``--mesh``)
    replaces every mesh of the policy; a role whose mesh and world disagree is not
    checked against either."""
    sink = _Sink(doc)
    data = doc.data
    world_given = world is not None
    world, top = _check_mesh(sink, data, built, world, mesh)
    roles = data.get("roles")
    named = roles if isinstance(roles, Mapping) else {}
    for role, spec, dropped in _in_file_order(built, named):
        if dropped & _WORLD_KEYS:
            continue  # what the checks would read was refused (and reported) already
        layout = _role_layout(sink, data, role, spec, world, top, mesh, world_given)
        if layout is None:
            continue
        if dropped & _ROLE_KEYS or not dropped.isdisjoint(registry.BACKENDS):
            # a partial role: only what its sound keys decide
            _check_ranks(sink, data, role, spec, *layout)
        else:
            _check_role(sink, data, role, spec, *layout)

    def spec_of(name: str) -> RoleSpec | None:
        """The role's settings with the mesh its checks used (colocation compares them)."""
        spec = built.roles.get(name) if name in named else built.unnamed
        if spec is None:
            return None
        return attrs.evolve(spec, name=name, mesh=FrozenDict(effective_mesh(mesh, spec.mesh, top)))

    groups = data.get("colocate")
    sound = [(index, group) for index, group in enumerate(groups or ())
             if built.refused.sound(("colocate", index))] if isinstance(groups, list) else []
    for message, path, severity in colocation.check(data, sound, origin, spec_of, world):
        sink.add(message, path, "error" if severity == "error" else "warning")
    for message, path, code in role_names.check(data, built, sink.errors):
        sink.add(message, path, "warning", code=code)
    return sink.problems()
