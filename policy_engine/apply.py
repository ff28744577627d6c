"""apply_policy and profile_session: the two ways training code meets a policy."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, Union

from .compiler import compile_plan
from .model import Policy
from .policy import ENV_FILE, load_policy
from .runtime.profiler import OffProfiler, RoleProfiler, wrap_region
from .topology import Topology

log = logging.getLogger("policy_engine")
PolicyArg = Union[str, "os.PathLike[str]", Mapping[str, Any], Policy, None]
Profiler = Union[RoleProfiler, OffProfiler]  # noqa: UP007


_warned: set[str] = set()


def _resolve(policy: PolicyArg) -> Policy | None:
    if policy is None:
        path = os.environ.get(ENV_FILE)
        if not path:
            return None
        policy = path
    loaded = load_policy(policy)
    if loaded.warnings and loaded.policy_hash not in _warned:
        _warned.add(loaded.policy_hash)  # once per policy per process, not per role
        for problem in loaded.warnings:
            log.warning("policy-engine: %s", problem.render())
    return loaded


def profile_session(policy: PolicyArg, role: str,
                    topology: Topology | None = None) -> Profiler:
    """A profiler for a plain training loop (``with profile_session(...) as prof:``).

    ``policy``: a path, a mapping, a loaded Policy, or None for ``$PROFILE_POLICY``
    (profiling is off when that is unset too).
    """
    loaded = _resolve(policy)
    if loaded is None:
        return OffProfiler(_off_plan(role, topology))
    plan = compile_plan(loaded, role, topology)
    if not plan.enabled:
        return OffProfiler(plan)
    return RoleProfiler(plan, policy_sources=loaded.sources)


def apply_policy(worker: object, role: str, policy: PolicyArg = None,
                 topology: Topology | None = None) -> Profiler:
    """Profile ``worker`` (one instance) as ``role``: wrap its region methods per the plan.

    On a rank whose plan is off nothing is wrapped: the methods stay the very same
    objects, and the returned profiler's methods do nothing.
    """
    prof = profile_session(policy, role, topology)
    if isinstance(prof, OffProfiler):
        return prof
    for region in prof.plan.regions:
        if not region.enabled:
            continue
        method = getattr(worker, region.name, None)
        if not callable(method):
            log.warning("policy-engine: role %r has region %r but %s has no such method",
                        role, region.name, type(worker).__name__)
            continue
        # An instance attribute: other instances of the class stay untouched.
        setattr(worker, region.name, wrap_region(prof, region.name, method))
    return prof


def _off_plan(role: str, topology: Topology | None) -> Any:
    from .plan import Plan

    topo = topology or Topology.discover()
    return Plan(role=role, rank=topo.rank, world=topo.world, enabled=False)
