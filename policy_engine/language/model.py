"""The validated policy as frozen objects, and the builder that makes them.

A role's settings are the schema's defaults (:func:`policy_engine.language.schema.build.defaults`),
then the policy's ``defaults``, then ``roles.<role>``, deep-merged (maps merge, lists
replace). :func:`build` turns what the schema accepted into the model: it parses each
block's values (ranks, steps, name templates; a backend block is checked by its backend),
reports those that do not parse, and builds every role whose blocks hold nothing refused.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from policy_engine import settings as registry
from policy_engine.errors import Problem, did_you_mean, json_path
from policy_engine.language.read.document import Document
from policy_engine.language.schema import build as schema
from policy_engine.language.schema.build import Refused
from policy_engine.language.values.frozen import FrozenDict, deep_merge, freeze, thaw
from policy_engine.language.values.mesh import effective_mesh
from policy_engine.language.values.naming import NameTemplate, TemplateError
from policy_engine.language.values.ranks import RankSelector
from policy_engine.language.values.schedule import Schedule
from policy_engine.language.values.selector import SelectorError
from policy_engine.language.values.steps import StepSet
from policy_engine.language.values.triggers import Limits, Triggers, parse_after

Path = tuple[str | int, ...]


@attrs.frozen
class RegionSpec:
    """A named stage of a worker. ``schedule`` applies when ``own_schedule`` is true."""

    name: str
    enabled: bool = True
    own_schedule: bool = False
    schedule: Schedule | None = None


@attrs.frozen
class RoleSpec:
    """One role's merged settings."""

    name: str
    enabled: bool
    #: the timeline tool (torch, mstx, nsight), or memory when it records alone
    backend: str
    ranks: RankSelector
    steps: StepSet
    merge_steps: bool
    schedule: Schedule | None
    discrete: bool
    regions: tuple[RegionSpec, ...]
    template: NameTemplate
    on_error: str
    #: ``backend``'s settings block
    settings: FrozenDict
    #: every backend recording the role's captures, ``backend`` first
    backends: tuple[str, ...] = ()
    #: each of ``backends``'s settings block, by name
    blocks: FrozenDict = attrs.field(factory=FrozenDict)
    #: what opens captures beyond ``steps`` (``triggers:``), and the budget (``limits:``)
    triggers: Triggers = attrs.field(factory=Triggers)
    limits: Limits = attrs.field(factory=Limits)
    #: ``export.mode`` (background, sync) and ``export.in_flight``
    export: str = "background"
    export_in_flight: int = 2
    #: the role's own ``mesh`` (its block's, else ``defaults``'); empty: the policy's
    #: top-level mesh (:meth:`Policy.mesh_for`). A mesh replaces, never merges.
    mesh: FrozenDict = attrs.field(factory=FrozenDict)
    #: whether the role's own block wrote ``mesh`` (else it came from ``defaults``)
    mesh_written: bool = attrs.field(default=False, eq=False)
    #: ``keep``: what stays of a torch trace once summarised (traces, summaries)
    keep: str = "traces"

    @property
    def backend_label(self) -> str:
        """``torch`` or ``torch+memory``: the backends, as messages and manifests show them."""
        return "+".join(self.backends or (self.backend,))


@attrs.frozen
class Policy:
    """A loaded, validated policy: what ``load_policy`` returns."""

    version: int
    prefix: str
    output_dir: str
    mesh: FrozenDict
    roles: FrozenDict
    defaults: Mapping[str, Any] = attrs.field(converter=freeze)
    source: str | None = None
    sources: tuple[str, ...] = ()
    policy_hash: str = ""
    #: The digest less ``output_dir``: one policy run into two folders is one policy.
    policy_content_hash: str = ""
    warnings: tuple[Problem, ...] = ()
    #: ``colocate:``: groups of roles that share a process, each in policy order.
    colocate: tuple[tuple[str, ...], ...] = ()

    def role(self, name: str) -> RoleSpec:
        """The merged settings of ``name``; a role the policy does not name gets defaults."""
        spec: RoleSpec | None = self.roles.get(name)
        return spec if spec is not None else build_role(name, thaw(self.defaults))

    @property
    def role_names(self) -> tuple[str, ...]:
        return tuple(self.roles)

    def unknown_role(self, name: str) -> str | None:
        """What a role the policy does not name gets said of it: None when the policy names
        ``name``; `` (did you mean 'actor'?)`` when it is close to a role the policy names
        (a typo: the run refuses it, the CLI warns); ``""`` otherwise (it gets the
        defaults)."""
        return None if name in self.roles else did_you_mean(name, self.roles)

    def group(self, name: str) -> tuple[str, ...]:
        """The colocation group ``name`` belongs to (policy order), or ``()``."""
        return next((group for group in self.colocate if name in group), ())

    def mesh_for(self, name: str) -> FrozenDict:
        """The mesh of role ``name``: its own (``roles.<name>.mesh``, else
        ``defaults.mesh``), else the top-level ``mesh``; empty when there is none."""
        return FrozenDict(effective_mesh(None, self.role(name).mesh, self.mesh))

    def mesh_path(self, name: str) -> str:
        """Where the mesh :meth:`mesh_for` gives was written, as a JSON path."""
        spec = self.role(name)
        if not spec.mesh:
            return "$.mesh"
        if name in self.roles and spec.mesh_written:
            return json_path(("roles", name, "mesh"))
        return "$.defaults.mesh"

    def with_mesh(self, mesh: Mapping[str, int]) -> Policy:
        """This policy with ``mesh`` for every role (the CLI's ``--mesh``): the top-level
        mesh replaced, the roles' own meshes dropped."""
        return attrs.evolve(
            self, mesh=FrozenDict(mesh),
            roles=FrozenDict({name: attrs.evolve(spec, mesh=FrozenDict())
                              for name, spec in self.roles.items()}),
            defaults={k: v for k, v in self.defaults.items() if k != "mesh"})


# ------------------------------------------------------------------ one role


def _schedule(raw: Mapping[str, Any] | None) -> Schedule | None:
    return None if raw is None else Schedule.from_mapping(raw)


def _regions(raw: Sequence[str] | Mapping[str, Any]) -> tuple[RegionSpec, ...]:
    if not isinstance(raw, Mapping):
        return tuple(RegionSpec(name) for name in raw)
    out = []
    for name, body in raw.items():
        merged = deep_merge(schema.defaults("region"), body or {})
        out.append(RegionSpec(name, bool(merged["enabled"]), "schedule" in merged,
                              _schedule(merged.get("schedule"))))
    return tuple(out)


def build_role(name: str, merged_defaults: Mapping[str, Any],
               role: Mapping[str, Any] | None = None) -> RoleSpec:
    """Role ``name`` from the policy's ``defaults`` and its own block, over the schema's
    defaults. The blocks must hold only values the schema and :func:`build` accepted."""
    raw = deep_merge(deep_merge(schema.defaults("role"), merged_defaults), role or {})
    names = raw["backend"] if isinstance(raw["backend"], list) else [raw["backend"]]
    found = registry.combination(names)[0]
    backend = found[0]
    return RoleSpec(
        name=name,
        enabled=bool(raw["enabled"]),
        backend=backend,
        ranks=RankSelector.parse(raw["ranks"]),
        steps=StepSet.parse(raw["steps"]),
        merge_steps=bool(raw["merge_steps"]),
        schedule=_schedule(raw["schedule"]),
        discrete=bool(raw["discrete"]),
        regions=_regions(raw["regions"]),
        template=NameTemplate.parse(raw["name"]),
        on_error=raw["on_error"],
        settings=FrozenDict(raw[backend]),
        backends=found,
        blocks=FrozenDict({name: FrozenDict(raw[name]) for name in found}),
        triggers=Triggers.from_mapping(raw["triggers"]),
        limits=Limits.from_mapping(raw["limits"]),
        export=raw["export"]["mode"],
        export_in_flight=raw["export"]["in_flight"],
        # A mesh lists dimensions in order: the role's replaces the defaults' whole.
        mesh=FrozenDict((role or {}).get("mesh", merged_defaults.get("mesh")) or {}),
        mesh_written="mesh" in (role or {}),
        keep=raw["keep"],
    )


# ------------------------------------------------------------------ a document


@attrs.frozen
class Built:
    """What :func:`build` made of a document."""

    #: Values that do not parse (and backend blocks their backend refuses), located.
    problems: tuple[Problem, ...]
    #: Everything refused: by the schema, and the values above.
    refused: Refused
    #: Each role whose blocks (its own and ``defaults``) hold nothing refused.
    roles: Mapping[str, RoleSpec]
    #: What a role the policy does not name gets; None when ``defaults`` is unsound.
    unnamed: RoleSpec | None
    #: Each role that holds something refused (``""``: the unnamed roles, when
    #: ``defaults`` does), built from its sound keys, with the keys left out (theirs or
    #: ``defaults``'): the checks that need none of those keys still run on it, so that
    #: a world-dependent problem is reported beside the others, not after they are fixed.
    partial: tuple[tuple[str, RoleSpec, frozenset[str]], ...] = ()


def _blocks(data: Mapping[str, Any]) -> Iterator[tuple[Path, Mapping[str, Any]]]:
    if isinstance(data.get("defaults"), Mapping):
        yield ("defaults",), data["defaults"]
    roles = data.get("roles")
    if isinstance(roles, Mapping):
        for name, body in roles.items():
            if isinstance(body, Mapping):
                yield ("roles", name), body


def _value_problems(key: str, value: Any) -> Iterator[tuple[str, Path, int | None]]:
    """What is wrong with one value of a role block that the schema accepted: (message,
    path inside the block)."""
    if key in ("ranks", "steps"):
        try:
            (RankSelector if key == "ranks" else StepSet).parse(value)
        except SelectorError as err:
            yield err.message, (key, *err.path), None
    elif key == "triggers" and isinstance(value, Mapping):
        yield from _trigger_problems(value)
    elif key == "name":
        try:
            NameTemplate.parse(value)
        except TemplateError as err:
            yield (f"bad name template at character {err.offset + 1}: {err.message}", (key,),
                   err.offset)
    elif key == "backend" and isinstance(value, list):
        for message, index in registry.combination(value)[1]:
            yield message, (key, index), None
    elif key in registry.BACKENDS:
        for message, sub in registry.check_settings(key, deep_merge(
                schema.defaults("role")[key], value)):
            # Point at the key the user wrote, or at the block when it came from defaults.
            yield message, ((key, *sub) if sub and sub[0] in value else (key,)), None


def _trigger_problems(value: Mapping[str, Any]) -> Iterator[tuple[str, Path, int | None]]:
    slow, stall = value.get("slow_step"), value.get("stall")
    if isinstance(slow, Mapping) and slow.get("reference") is not None:
        try:  # slow_step's reference ranks: a rank selector
            RankSelector.parse(slow["reference"])
        except SelectorError as err:
            yield err.message, ("triggers", "slow_step", "reference", *err.path), None
    if isinstance(stall, Mapping) and "after" in stall:
        try:  # a multiple of the median step: more than 1x
            parse_after(stall["after"])
        except ValueError as err:
            yield str(err), ("triggers", "stall", "after"), None


def build(doc: Document, refused: Refused) -> Built:
    """Parse the values of every block that the schema did not refuse, in the order the
    file writes them, and build the roles that hold nothing refused."""
    problems: list[Problem] = []
    unparsed: set[Path] = set()
    for path, body in _blocks(doc.data):
        for key, value in body.items():
            if not refused.sound((*path, key)):
                continue  # the schema reported it
            for message, sub, char in _value_problems(key, value):
                where = (*path, *sub)
                unparsed.add(where)
                problems.append(Problem(message, json_path(where),
                                        doc.locate(where).at_character(char)))
    sound = refused.adding(unparsed)
    defaults = doc.data.get("defaults") or {}
    named = doc.data.get("roles")
    roles: dict[str, RoleSpec] = {}
    partial: list[tuple[str, RoleSpec, frozenset[str]]] = []
    unnamed = None
    kept_defaults, dropped = _sound_keys(defaults, ("defaults",), sound)
    if kept_defaults is None:  # nothing is built on a refused defaults block
        return Built(tuple(problems), sound, roles, unnamed)
    if not dropped:
        unnamed = build_role("", defaults)
    else:
        _add_partial(partial, "", kept_defaults, None, dropped)
    for name, body in (named.items() if isinstance(named, Mapping) else ()):
        if not dropped and sound.sound(("roles", name)):
            roles[name] = build_role(name, defaults, body or {})
            continue
        kept, own = _sound_keys(body or {}, ("roles", name), sound)
        if kept is not None:
            _add_partial(partial, name, kept_defaults, kept, dropped | own)
    return Built(tuple(problems), sound, roles, unnamed, tuple(partial))


def _sound_keys(body: Any, path: Path, sound: Refused
                ) -> tuple[dict[str, Any] | None, frozenset[str]]:
    """The keys of block ``body`` at ``path`` that hold nothing refused, and the others;
    None when the block itself (or what holds it) was refused."""
    if not isinstance(body, Mapping) or any(path[:i] in sound.paths
                                            for i in range(1, len(path) + 1)):
        return None, frozenset()
    kept = {k: v for k, v in body.items() if sound.sound((*path, k))}
    return kept, frozenset(body) - frozenset(kept)


def _add_partial(out: list[tuple[str, RoleSpec, frozenset[str]]], name: str,
                 defaults: Mapping[str, Any], body: Mapping[str, Any] | None,
                 dropped: frozenset[str]) -> None:
    """Role ``name`` from its sound keys (the others fall back to the defaults below)."""
    try:
        spec = build_role(name, defaults, body)
    except Exception:  # a mix of sound keys that does not build: not checked
        return
    out.append((name, spec, dropped))


# ------------------------------------------------------------------ the policy


def _policy_order(groups: Any, roles: Mapping[str, Any]) -> tuple[tuple[str, ...], ...]:
    """Each group's roles in the order ``roles:`` lists them, unlisted ones after."""
    order = {name: i for i, name in enumerate(roles)}
    return tuple(tuple(sorted(group, key=lambda r: (order.get(r, len(order)), group.index(r))))
                 for group in groups or ())


def policy_hash(data: Mapping[str, Any]) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_policy(doc: Document, built: Built, *,
                 warnings: tuple[Problem, ...] = ()) -> Policy:
    """The frozen Policy of a document that :func:`build` found sound throughout."""
    data = doc.data
    top = schema.defaults()
    source = doc.origin if doc.sources else None  # a mapping has no folder of its own
    base = os.path.dirname(os.path.abspath(source)) if source else os.getcwd()
    output_dir = os.path.join(base, os.path.expanduser(data.get("output_dir",
                                                                top["output_dir"])))
    return Policy(
        version=int(data["version"]),
        prefix=str(data.get("prefix", top["prefix"])),
        output_dir=os.path.normpath(output_dir),
        mesh=FrozenDict(data.get("mesh") or {}),
        roles=FrozenDict(built.roles),
        defaults=data.get("defaults") or {},
        source=source,
        sources=doc.sources,
        policy_hash=policy_hash(data),
        policy_content_hash=policy_hash({k: v for k, v in data.items() if k != "output_dir"}),
        warnings=warnings,
        colocate=_policy_order(data.get("colocate"), data.get("roles") or {}),
    )
