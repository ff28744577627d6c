"""compile_plan: a policy, a role and a process's place in the job -> an immutable Plan."""

from __future__ import annotations

import socket
from collections.abc import Callable

import attrs

from policy_engine.errors import PolicyError, Problem
from policy_engine.language.model import Policy, RoleSpec
from policy_engine.language.rules.colocation import window_roles
from policy_engine.language.values.frozen import FrozenDict
from policy_engine.language.values.mesh import DIMS
from policy_engine.language.values.steps import StepSet
from policy_engine.plan.plan import Plan, RegionPlan
from policy_engine.plan.topology import Topology


def resolve_topology(policy: Policy, topology: Topology | None,
                     role: str | None = None) -> Topology:
    """``topology`` (or the discovered one) with the coordinates no live source gave filled
    in from the mesh of ``role`` (its own, else the top-level one; the top-level one when
    ``role`` is None). Live coordinates win."""
    if topology is None:
        topology = Topology.discover()
    mesh = policy.mesh if role is None else policy.mesh_for(role)
    if mesh and any(dim not in topology.coords for dim in mesh):
        try:
            topology = topology.with_mesh(dict(mesh))
        except ValueError as err:
            where = "$.mesh" if role is None else policy.mesh_path(role)
            raise PolicyError([Problem(str(err), where, None)]) from None
    return topology


def selects(spec: RoleSpec, topo: Topology) -> bool:
    """Whether ``spec`` profiles on the process ``topo`` describes: the rule of the
    runtime, explain and nsys-args alike (:func:`~policy_engine.plan.placement.places`
    asks the same selector for a whole simulated world at once)."""
    return spec.enabled and spec.ranks.matches(
        topo.rank, topo.world, topo.selector_coords(), topo.selector_sizes())


def compile_plan(policy: Policy, role: str, topology: Topology | None = None) -> Plan:
    """The plan for ``role`` on the process ``topology`` describes (discovered if None).

    A rank the role's ``ranks`` do not select, or a disabled role, gets a plan with
    ``enabled`` false: the runtime then does nothing at all.
    """
    spec = policy.role(role)
    if not spec.enabled:
        # A disabled role needs no coordinates: its group may not even match the mesh.
        topo = topology if topology is not None else Topology.discover()
        return Plan.off(spec, topo.rank, topo.world, local_rank=topo.local_rank,
                        node=topo.node, policy_source=policy.source,
                        policy_hash=policy.policy_hash,
                        policy_content_hash=policy.policy_content_hash)
    base = topology if topology is not None else Topology.discover()
    topo = resolve_topology(policy, base, role)
    colocated = _colocated(policy, role, base, topo)
    bound = {
        "prefix": policy.prefix, "rank": topo.rank, "world": topo.world,
        "local_rank": topo.local_rank, "node": topo.node, "backend": spec.backend,
        **{dim: topo.coords.get(dim) for dim in DIMS},
    }
    # <role>: the window's roles, alike on every rank and step (who took part on this
    # rank is the manifest's `roles`, from Plan.roles_for).
    bound["role"] = "+".join(window_roles(policy, role))
    if "host" in spec.template.fields() and topo.source != "simulated":
        bound["host"] = socket.gethostname().split(".")[0]
    regions = region_plans(spec)
    return Plan(
        spec,
        topo.rank,
        topo.world,
        selects(spec, topo),
        spec.template.bind(bound),
        local_rank=topo.local_rank,
        node=topo.node,
        coords=FrozenDict({k: topo.coords[k] for k in DIMS if k in topo.coords}),
        regions=regions,
        output_dir=policy.output_dir,
        policy_source=policy.source,
        policy_hash=policy.policy_hash,
        policy_content_hash=policy.policy_content_hash,
        colocated=colocated,
    )


def place_key(policy: Policy, role: str) -> Callable[[Topology], tuple[object, ...]]:
    """What, besides its place, sets apart the plan :func:`compile_plan` makes for the
    enabled ``role`` on a simulated process (one the role selects), as a function of the
    process's topology: the declared colocated roles that select it too.

    Two such processes of one world with equal keys get plans that differ only in
    ``rank``, ``local_rank``, ``node``, ``coords`` and the name fields bound from them
    (``<host>`` is bound on live processes only). explain compiles one plan per key.
    """
    if not policy.group(role):
        return lambda topology: ()

    def key(topology: Topology) -> tuple[object, ...]:
        return _colocated(policy, role, topology, resolve_topology(policy, topology, role))
    return key


def region_plans(spec: RoleSpec) -> tuple[RegionPlan, ...]:
    """Each region of ``spec`` with the schedule its calls run (its own, else the role's)."""
    return tuple(RegionPlan(r.name, r.enabled, r.schedule if r.own_schedule else spec.schedule)
                 for r in spec.regions)


def counting_plan(spec: RoleSpec) -> Plan:
    """The plan of any process ``spec`` profiles, placed nowhere (rank 0 of 1, its name
    template unbound): what counts the captures and traces of the role as a whole."""
    return Plan(spec, 0, 1, True, spec.template, regions=region_plans(spec))


def _colocated(policy: Policy, role: str, base: Topology,
               topo: Topology) -> tuple[tuple[str, StepSet], ...]:
    """The declared colocated roles that share this rank's captures with ``role``: same
    backend, enabled, selecting this rank (placed in its own mesh); in policy order,
    ``role`` included."""
    group = policy.group(role)
    if not group:
        return ()
    backend = policy.role(role).backend
    out = []
    for peer in group:
        spec = policy.role(peer)
        if peer == role or (spec.backend == backend and spec.enabled
                            and selects(spec, _placed(policy, peer, role, base, topo))):
            out.append((peer, spec.steps))
    return tuple(out)


def _placed(policy: Policy, peer: str, role: str, base: Topology, topo: Topology) -> Topology:
    """This process as colocated role ``peer`` sees it: ``role``'s placement when they
    share a mesh, else ``base`` placed anew in ``peer``'s mesh (its coordinates, live or
    simulated, are those of ``role``'s mesh)."""
    mesh = policy.mesh_for(peer)
    if list(mesh.items()) == list(policy.mesh_for(role).items()):
        return topo
    base = attrs.evolve(base, coords={}, sizes={})
    try:
        return resolve_topology(policy, base, peer)
    except PolicyError:
        return base  # its mesh does not cover this world: validate says so
