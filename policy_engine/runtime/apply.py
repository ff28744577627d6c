"""apply_policy and profile_session: the two ways training code meets a policy."""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from collections.abc import Mapping
from typing import Any, Union

from policy_engine.errors import PolicyError, Problem
from policy_engine.language.load import ENV_FILE, load_policy
from policy_engine.language.model import Policy, build_role
from policy_engine.language.read.overrides import ENV_OVERRIDES
from policy_engine.language.rules.checks import COORDINATES_WITHOUT_MESH
from policy_engine.language.values.mesh import DIMS
from policy_engine.plan.compile import compile_plan
from policy_engine.plan.plan import Plan
from policy_engine.plan.topology import Topology
from policy_engine.runtime.process.state import STATE, warn_once
from policy_engine.runtime.role.off import OffProfiler
from policy_engine.runtime.role.profiler import RoleProfiler
from policy_engine.runtime.role.wrapping import Patches, marked

log = logging.getLogger("policy_engine")
PolicyArg = Union[str, "os.PathLike[str]", Mapping[str, Any], Policy, None]
Profiler = Union[RoleProfiler, OffProfiler]  # noqa: UP007

#: Codes of validate-time warnings that depend on where a process sits; compile_plan says
#: at run time whether they hold for this process.
_LAYOUT_WARNINGS = frozenset({COORDINATES_WITHOUT_MESH})


def _from_environment(policy: PolicyArg, problems: tuple[Problem, ...]) -> bool:
    """Whether the policy's mistakes come from the environment the job was started with."""
    if policy is None:
        return True
    return any(p.location is not None and p.location.origin.startswith(ENV_OVERRIDES)
               for p in problems if p.severity == "error")


def resolve_policy(policy: PolicyArg) -> Policy | None:
    """The loaded policy; None when profiling is off (no policy, or a broken one from the
    environment: a typo in PROFILE_POLICY_SET must not stop training)."""
    given = policy
    if policy is None:
        path = os.environ.get(ENV_FILE)
        if not path:
            return None
        policy = path
    try:
        loaded = load_policy(policy)
    except PolicyError as err:
        if not _from_environment(given, err.problems):
            raise
        for problem in err.problems:  # warnings come with the errors: each at its level
            log.log(logging.ERROR if problem.severity == "error" else logging.WARNING,
                    "policy-engine: %s", problem.render())
        warn_once(("broken-env-policy",),
                  "policy-engine: the policy from %s is invalid (errors above): profiling "
                  "is off in this process; `policy-engine validate` with the same %s shows "
                  "the same errors", ENV_FILE if given is None else ENV_OVERRIDES,
                  ENV_OVERRIDES)
        return None
    for problem in loaded.warnings:  # once per policy per process, not per role
        if problem.code not in _LAYOUT_WARNINGS:
            warn_once(("policy-warning", loaded.policy_hash, problem),
                      "policy-engine: %s", problem.render())
    return loaded


def _check_role(policy: Policy, role: str) -> None:
    """A role the policy does not name gets the defaults, unless the name looks like a
    typo of one it does name: that is an error, not a silently idle profiler."""
    hint = policy.unknown_role(role)
    if hint is None:
        return
    if hint:
        raise PolicyError.single(
            f"role {role!r} is not in the policy{hint}; roles: {', '.join(policy.roles)}",
            path="$.roles")
    if not policy.role(role).enabled:
        log.info("policy-engine: role %r is not in the policy: it gets the defaults, which "
                 "are disabled", role)


def _warn_missing_coordinates(policy: Policy, plan: Plan) -> None:
    """Say so when ``ranks`` selects by coordinates this process does not have: then no
    rank of the role profiles (validate can only warn that it might happen)."""
    spec = policy.role(plan.role)
    if not spec.enabled:
        return
    named = {axis.dim for axes in spec.ranks.clauses for axis in axes} & set(DIMS)
    missing = sorted(named - set(plan.coords))
    if missing:
        warn_once(("no-coordinates", plan.role, tuple(missing)),
                  "policy-engine: role %r selects ranks by %s, but this process has no such "
                  "coordinate (no DeviceMesh, Megatron or policy mesh gives one): no rank of "
                  "the role profiles; pass topology=Topology.from_device_mesh(mesh) or add a "
                  "mesh to the policy", plan.role, ", ".join(missing))


def profile_session(policy: PolicyArg, role: str,
                    topology: Topology | None = None) -> Profiler:
    """A profiler for a plain training loop (``with profile_session(...) as prof:``).

    ``policy``: a path, a mapping, a loaded Policy, or None for ``$PROFILE_POLICY``
    (profiling is off when that is unset too).
    """
    return _profiler(*_plan(policy, role, topology))


def _plan(policy: PolicyArg, role: str,
          topology: Topology | None) -> tuple[Plan, tuple[str, ...] | None]:
    """The role's plan in this process, and the policy's source files (None: no policy,
    profiling is off)."""
    loaded = resolve_policy(policy)
    if loaded is None:
        topo = topology or Topology.discover()
        return Plan.off(build_role(role, {}), topo.rank, topo.world), None
    _check_role(loaded, role)
    plan = compile_plan(loaded, role, topology)
    _warn_missing_coordinates(loaded, plan)
    return plan, loaded.sources


def _profiler(plan: Plan, sources: tuple[str, ...] | None) -> Profiler:
    """The profiler that carries ``plan`` out (a RoleProfiler starts the role's listener
    thread when it has triggers: built only once it is known to be needed)."""
    if sources is None or not plan.enabled:
        return OffProfiler(plan)
    return RoleProfiler(plan, policy_sources=sources)


def _applied(worker: object, role: str) -> tuple[RoleProfiler, Patches | None] | None:
    """The profiler ``role`` already has on ``worker``, with the methods it patched there
    (found in the process's registry; a worker that cannot be weak-referenced is found
    through its wrapped methods, and its patches are not known)."""
    entry = STATE.applied.get((id(worker), role))
    if entry is not None:
        ref, prof, patches = entry
        # what apply_policy keeps there: a RoleProfiler and its Patches
        if ref() is worker and isinstance(prof, RoleProfiler) and isinstance(patches, Patches):
            return prof, patches
        del STATE.applied[(id(worker), role)]
    for value in vars(worker).values() if hasattr(worker, "__dict__") else ():
        prof = marked(value, role)
        if prof is not None:
            return prof, None
    return None


def _unwrap(worker: object, role: str, patches: Patches | None) -> None:
    if patches is not None:
        patches.restore()
        return
    for name, value in list(vars(worker).items()):
        if marked(value, role) is not None:
            setattr(worker, name, value.__wrapped__)


def apply_policy(worker: object, role: str, policy: PolicyArg = None,
                 topology: Topology | None = None) -> Profiler:
    """Profile ``worker`` (one instance) as ``role``: wrap its region methods per the plan.

    On a rank whose plan is off nothing is wrapped: the methods stay the very same
    objects, and the returned profiler's methods do nothing. Applying the same role to the
    same worker again returns the profiler it has when the plan is the same; otherwise
    the earlier profiler is closed and its wrappers removed first.
    """
    plan, sources = _plan(policy, role, topology)
    earlier = _applied(worker, role)
    if earlier is not None:
        found, patches = earlier
        # compared before a profiler is built: a second one would start a second listener
        # thread for the same plan, and leave it running beside the first
        if sources is not None and plan.enabled and plan == found.plan:
            return found
        found.close()
        _unwrap(worker, role, patches)
        STATE.applied.pop((id(worker), role), None)
    prof = _profiler(plan, sources)
    if isinstance(prof, OffProfiler):
        return prof
    patches = Patches()
    patches.regions(worker, role, [r.name for r in prof.plan.regions if r.enabled],
                    prof.annotate)
    # A worker that cannot be weak-referenced is found through its wrapped methods only.
    with contextlib.suppress(TypeError):
        STATE.applied[(id(worker), role)] = (weakref.ref(worker), prof, patches)
    return prof

