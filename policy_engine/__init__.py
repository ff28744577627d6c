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
    from .apply import apply_policy, profile_session
    from .compiler import compile_plan
    from .errors import Location, PolicyError, Problem, ProfilingError
    from .model import Policy
    from .plan import Plan
    from .policy import load_policy
    from .runtime.profiler import OffProfiler, RoleProfiler
    from .topology import Topology

_WHERE = {
    "apply_policy": "apply", "profile_session": "apply", "compile_plan": "compiler",
    "Location": "errors", "PolicyError": "errors", "Problem": "errors",
    "ProfilingError": "errors", "Policy": "model", "Plan": "plan", "load_policy": "policy",
    "OffProfiler": "runtime.profiler", "RoleProfiler": "runtime.profiler",
    "Topology": "topology",
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
