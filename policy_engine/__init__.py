"""policy-engine: declarative profiling policies for distributed PyTorch training.

    prof = apply_policy(worker, role="actor")      # in the worker's constructor
    with prof.training_step(step):                 # in the training loop
        ...
        prof.step()                                # once per inner step (mini-batch)

Names are imported on first use, so the command line pays only for what it runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from policy_engine.errors import Location, PolicyError, Problem, ProfilingError
    from policy_engine.language.load import load_policy
    from policy_engine.language.model import Policy
    from policy_engine.plan.compile import compile_plan
    from policy_engine.plan.plan import Plan
    from policy_engine.plan.topology import Topology
    from policy_engine.runtime.apply import apply_policy, profile_session
    from policy_engine.runtime.role.off import OffProfiler
    from policy_engine.runtime.role.profiler import RoleProfiler

_WHERE = {
    "apply_policy": "runtime.apply", "profile_session": "runtime.apply",
    "compile_plan": "plan.compile", "Location": "errors", "PolicyError": "errors",
    "Problem": "errors", "ProfilingError": "errors", "Policy": "language.model",
    "Plan": "plan.plan", "load_policy": "language.load",
    "OffProfiler": "runtime.role.off", "RoleProfiler": "runtime.role.profiler",
    "Topology": "plan.topology",
}
__all__ = [
    "Location",
    "OffProfiler",
    "Plan",
    "Policy",
    "PolicyError",
    "Problem",
    "ProfilingError",
    "RoleProfiler",
    "Topology",
    "apply_policy",
    "compile_plan",
    "load_policy",
    "profile_session",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'policy_engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return [*globals(), *__all__]
