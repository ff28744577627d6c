"""``colocate:``: roles that share a process, and whether they can share its captures.

A process runs one capture per backend at a time, so colocated roles on one backend share
it: one schedule, one name template, one settings block. What cannot be shared is an
error here, before launch, instead of a surprise in the traces.

A shared capture is named after its *window* (:func:`window_roles`): the group as declared,
the same on every rank and step, so that every rank's trace of one step lands in one
folder; which roles took part on a rank is the manifest's ``roles``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from policy_engine.errors import did_you_mean
from policy_engine.language.model import Policy, RoleSpec
from policy_engine.language.rules import clash
from policy_engine.language.values.mesh import DIMS, format_mesh, mesh_size

Path = tuple[str | int, ...]
Found = tuple[str, Path, str]  # message, where, severity
#: Where a role's value for a field was written: ``checks.origin``.
Origin = Callable[[Mapping[str, Any], str, str], Path]
#: A role's built settings, None when its blocks hold a refused value.
SpecOf = Callable[[str], "RoleSpec | None"]

# What colocated roles on one backend must agree on, and why in a word.
_SHARED = (
    ("backends", "list of backends"),
    ("discrete", "mode"),
    ("merge_steps", "merge_steps"),
    ("schedule", "schedule"),
    ("name", "name template"),
    ("on_error", "on_error"),
    ("keep", "keep"),
)


def window_roles(policy: Policy, role: str) -> tuple[str, ...]:
    """The roles ``<role>`` names in a capture of ``role``: every enabled member of its
    ``colocate`` group on its backend, in the order ``roles:`` lists them (``role``
    alone without a group). Nothing here depends on the rank or the step, so each rank
    of a window names it alike, whichever of the roles take part there."""
    group = policy.group(role)
    if not group:
        return (role,)
    backend = policy.role(role).backend
    return tuple(peer for peer in group if peer == role or (
        policy.role(peer).enabled and policy.role(peer).backend == backend))


def check(data: Mapping[str, Any], groups: Sequence[tuple[int, Sequence[str]]],
          origin: Origin, spec_of: SpecOf, world: int | None = None) -> Iterator[Found]:
    """Problems of the ``colocate`` groups whose shape the schema accepted, each with its
    index. A group is checked for conflicts when every role in it could be built;
    ``world``: the job's size, against which the window's names are proven distinct."""
    roles = data.get("roles") if isinstance(data.get("roles"), Mapping) else {}
    assert isinstance(roles, Mapping)
    placed: dict[str, int] = {}
    for gi, group in groups:
        for mi, name in enumerate(group):
            at: Path = ("colocate", gi, mi)
            if name in placed and placed[name] != gi:
                yield (f"role {name!r} is in colocate groups {placed[name]} and {gi}: "
                       "a role runs in one process group", at, "error")
            placed.setdefault(name, gi)
            if name not in roles:
                hint = did_you_mean(name, roles)
                yield (f"colocated role {name!r} is not under roles{hint}: it gets the "
                       "defaults", at, "warning")
        specs = [spec_of(name) for name in group]
        if all(spec is not None for spec in specs):
            enabled = [spec for spec in specs if spec is not None and spec.enabled]
            yield from _conflicts(data, gi, enabled, origin, world)


def _show(value: object) -> str:
    text = str(value) if not isinstance(value, str) or value.startswith(("{", "none")) \
        else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _value(spec: RoleSpec, key: str) -> object:
    if key == "name":
        return spec.template.text
    if key == "backends":
        return spec.backend_label
    if key == "schedule":
        if spec.schedule is None:
            return "none"
        fields = spec.schedule.to_json()
        return "{" + ", ".join(f"{k}: {v}" for k, v in fields.items() if v or k == "active") + "}"
    return getattr(spec, key)


def _conflicts(data: Mapping[str, Any], gi: int, specs: list[RoleSpec],
               origin: Origin, world: int | None) -> Iterator[Found]:
    at: Path = ("colocate", gi)
    by_backend: dict[str, list[RoleSpec]] = {}
    for spec in specs:
        by_backend.setdefault(spec.backend, []).append(spec)
    history = [s for s in specs if "memory" in s.backends]
    for other in history[1:]:
        if other.backend != history[0].backend:
            yield (f"colocated roles {history[0].name!r} ({history[0].backend_label}) and "
                   f"{other.name!r} ({other.backend_label}) would both record allocator "
                   "history, which a process has once: give them the same backends",
                   origin(data, other.name, "backend"), "error")
    if "torch" in by_backend and "mstx" in by_backend:
        torch, npu = by_backend["torch"][0].name, by_backend["mstx"][0].name
        yield (f"colocated roles {torch!r} (torch) and {npu!r} (mstx) cannot share a process: "
               "torch.profiler and torch_npu's profiler drive the same framework profiler, "
               "one at a time", at, "error")
    cuda = [s.name for s in by_backend.get("torch", ()) if "cuda" in s.settings["activities"]]
    if cuda and "nsight" in by_backend:
        yield (f"colocated roles {cuda[0]!r} (torch with cuda activity) and "
               f"{by_backend['nsight'][0].name!r} (nsight) both use CUPTI in one process: "
               "the torch traces may lose their CUDA kernels; record cpu only with torch, "
               "or profile these roles apart", at, "warning")
    for backend, members in by_backend.items():
        yield from _window_names(_in_policy_order(members, data), at, world)
        first = members[0]
        for other in members[1:]:
            for key, what in _SHARED:
                mine, theirs = _value(first, key), _value(other, key)
                if mine != theirs:
                    yield (f"colocated roles {first.name!r} and {other.name!r} share {backend} "
                           f"captures but differ in {what} ({_show(mine)} and "
                           f"{_show(theirs)}): one capture has one {what}",
                           origin(data, other.name, "backend" if key == "backends" else key),
                           "error")
            for block in first.backends or (backend,):
                if block in other.blocks and \
                        dict(first.blocks[block]) != dict(other.blocks[block]):
                    yield (f"colocated roles {first.name!r} and {other.name!r} share {backend} "
                           f"captures but differ in their {block} settings: one capture has "
                           "one profiler configuration", origin(data, other.name, block),
                           "error")
            if (first.template.fields() & set(DIMS)) and \
                    list(first.mesh.items()) != list(other.mesh.items()):
                yield (f"colocated roles {first.name!r} and {other.name!r} share {backend} "
                       "captures but lay out their ranks on different meshes "
                       f"({format_mesh(first.mesh) or 'none'} and "
                       f"{format_mesh(other.mesh) or 'none'}) while the name shows "
                       "coordinates: one capture has one name; give them one mesh, or drop "
                       "<tp><pp><dp><cp><ep> from the name", origin(data, other.name, "mesh"),
                       "error")
            if first.merge_steps and first.steps != other.steps:
                yield (f"colocated roles {first.name!r} and {other.name!r} merge steps into "
                       f"shared {backend} captures but profile different steps ({first.steps} "
                       f"and {other.steps}): one merged capture covers one run of steps",
                       origin(data, other.name, "steps"), "error")


def _in_policy_order(specs: list[RoleSpec], data: Mapping[str, Any]) -> list[RoleSpec]:
    """``specs`` in the order ``roles:`` lists them, the others after (as names are)."""
    roles = data.get("roles")
    order = {name: i for i, name in enumerate(roles if isinstance(roles, Mapping) else ())}
    return sorted(specs, key=lambda spec: order.get(spec.name, len(order)))


def _window_names(members: list[RoleSpec], at: Path, world: int | None) -> Iterator[Found]:
    """The roles of a window write one name (:func:`window_roles`), so the ranks of all of
    them must be told apart, not each role's alone: ``actor`` on rank 0 and ``rollout``
    on rank 1 named ``<role>_step<step>`` would both write ``actor+rollout_step2``. Each
    role's own ranks are proven by ``checks``; this proves their union, as boxes."""
    first = members[0]
    fields = first.template.fields()
    if len(members) < 2 or "rank" in fields or {"node", "local_rank"} <= fields or \
            any(m.template.text != first.template.text for m in members) or \
            len({str(m.ranks) for m in members}) == 1:
        return  # one role's proof covers the window; other templates: an error already
    names = ", ".join(repr(m.name) for m in members[:-1]) + f" and {members[-1].name!r}"
    label = "+".join(m.name for m in members)
    if world is None:
        yield (f"colocated roles {names} select different ranks but share one name "
               f"({label!r} on every rank), and the name does not show <rank>: two of their "
               "ranks could write the same file; add <rank>", at, "error")
        return
    meshes = {tuple(m.mesh.items()) for m in members}
    mesh = dict(first.mesh) if len(meshes) == 1 else None
    if len(meshes) > 1 or (mesh and mesh_size(mesh) != world):
        return  # the meshes disagree (an error when the name shows coordinates)
    try:
        boxes = [box for m in members for box in m.ranks.boxes(world, mesh)]
    except ValueError:
        return  # a selector the mesh refuses: reported with its role
    sizes = list(mesh.values()) if mesh else [world]
    shown = [i for i, dim in enumerate(mesh or {}) if dim in fields and dim in DIMS]
    if len(boxes) <= clash.MAX_BOXES:
        pair = clash.clash(boxes, sizes, shown)
    elif sum(clash.box_size(box) for box in boxes) <= clash.MAX_LISTED:
        pair = clash.clash_listed(boxes, sizes, shown)
    else:
        yield (f"cannot prove that the name tells apart the ranks of colocated roles {names}, "
               f"which share one name ({label!r}): their ranks selectors are too complex to "
               "check; add <rank>", at, "error")
        return
    if pair is not None:
        yield (f"the name cannot tell apart ranks {pair[0]} and {pair[1]} of colocated roles "
               f"{names}, which share one name on every rank ({label!r}); add <rank>",
               at, "error")
