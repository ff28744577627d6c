"""policy-engine: declarative profiling policies for distributed PyTorch training.

    prof = apply_policy(worker, role="actor")      # in the worker's constructor
    with prof.training_step(step):                 # in the training loop
        ...
        prof.step()                                # once per inner step (mini-batch)
"""

from __future__ import annotations

from .apply import apply_policy, profile_session
from .compiler import compile_plan
from .errors import Location, PolicyError, Problem, ProfilingError
from .model import Policy
from .plan import Plan
from .runtime.profiler import OffProfiler, RoleProfiler
from .policy import load_policy
from .topology import Topology

__all__ = [
    "Location",
    "OffProfiler",
    "RoleProfiler",
    "apply_policy",
    "profile_session",
    "Plan",
    "Policy",
    "PolicyError",
    "Problem",
    "ProfilingError",
    "Topology",
    "compile_plan",
    "load_policy",
]
__version__ = "0.1.0"
