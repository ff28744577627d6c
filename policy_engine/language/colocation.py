"""``colocate:``: roles that share a process, and whether they can share its captures.

A process runs one capture per backend at a time, so colocated roles on one backend share
it: one schedule, one name template, one settings block. What cannot be shared is an
error here, before launch, instead of a surprise in the traces.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from policy_engine.errors import did_you_mean
from policy_engine.language.mesh import DIMS, format_mesh
from policy_engine.language.model import RoleSpec

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
)


def check(data: Mapping[str, Any], groups: Sequence[tuple[int, Sequence[str]]],
          origin: Origin, spec_of: SpecOf) -> Iterator[Found]:
    """Problems of the ``colocate`` groups whose shape the schema accepted, each with its
    index. A group is checked for conflicts when every role in it could be built."""
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
            yield from _conflicts(data, gi, enabled, origin)


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
               origin: Origin) -> Iterator[Found]:
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
