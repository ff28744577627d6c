"""The two small parts a :class:`~policy_engine.runtime.profiler.RoleProfiler` is made
of: what every capture of the role is opened with (:class:`Fixed`, set when the role
starts) and where the training loop is (:class:`Loop`, changed as it goes)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

from policy_engine.backends.combined import Combined
from policy_engine.plan.plan import Plan
from policy_engine.runtime import export, manifest, standing
from policy_engine.runtime.budget import Budget
from policy_engine.runtime.capture import Capture
from policy_engine.runtime.triggers import Listener

# How the code drives the profiler; decided by its first call.
NEW, SESSION, STEPS = "new", "session", "steps"

Why = tuple[str, str | None, int]  # a trigger: its kind, its request, its last step


#: The torch profiler's settings that change what a trace holds (compare withholds its
#: verdict where two runs differ in them).
_RECORDED = ("activities", "record_shapes", "profile_memory", "with_stack", "with_flops",
             "with_modules")


def recording(plan: Plan) -> dict[str, Any]:
    """How a torch capture of ``plan`` records: the torch version (``torch``) and the
    settings that change what the trace holds (``recorded``); nothing for other backends."""
    if "torch" not in plan.backends:
        return {}
    settings = plan.settings
    recorded = {k: (sorted(settings[k]) if k == "activities" else settings[k])
                for k in _RECORDED if k in settings}
    found = sys.modules.get("torch")
    version = getattr(found, "__version__", None)
    if version is None:
        try:
            version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            version = None
    return {"recorded": recorded, **({"torch": str(version)} if version else {})}


class Loop:
    """Where the role's training loop is, as the profiler's calls report it."""

    __slots__ = ("captured", "mode", "off", "outer", "own", "provisional", "why")

    def __init__(self) -> None:
        self.mode = NEW
        self.off: str | None = None  # why the profiler stopped for good
        self.outer: int | None = None  # the outer step under way
        self.own: Capture | None = None  # the capture this role opened and runs
        self.captured = False  # the step under way is inside a capture
        self.why: Why | None = None  # what triggered this step beyond the plan
        # The whole-session capture `with prof:` opened, until the first step() keeps it:
        # a training_step(n) before that drops it (RoleProfiler.__enter__).
        self.provisional: Capture | None = None


class Fixed:
    """What the role opens every capture with: the identity fields of its manifest lines,
    the backend's settings, its limits, triggers and exporter."""

    __slots__ = ("budget", "combined", "env", "exporter", "identity", "late", "listener",
                 "release", "settings")

    def __init__(self, plan: Plan, settings: Mapping[str, Any],
                 policy_sources: tuple[str, ...], note: Callable[..., None]) -> None:
        self.settings = settings
        self.env = {f: os.environ.get(f[4:], "") for f in plan.template.fields()
                    if f.startswith("env:")}
        self.identity = {
            "role": plan.role, "rank": plan.rank, "world": plan.world,
            "coords": dict(plan.coords), "local_rank": plan.local_rank, "node": plan.node,
            "backend": plan.spec.backend_label, "plan_hash": plan.plan_hash,
            "policy_file": plan.policy_source, "policy_hash": plan.policy_hash,
            "policy_file_hash": manifest.file_hash(policy_sources), "pid": os.getpid(),
            **recording(plan),
        }
        spec = plan.spec
        limits = spec.limits
        self.budget = Budget(limits, note, plan.role) if (
            limits.captures is not None or limits.bytes is not None) else None
        self.listener = Listener(plan, spec.triggers, note) if spec.triggers.any else None
        self.exporter = export.exporter(spec.export_in_flight) \
            if spec.export == "background" else None
        self.late: list[BaseException] = []  # background exports that failed
        self.combined: Combined | None = None  # several backends: made on first open
        # history kept outside captures (runtime.standing), released with the role
        self.release: Callable[[], None] | None = None

    def keep_history(self, plan: Plan, backend_of: Callable[[str], Any],
                     outer: Callable[[], int | None], note: Callable[..., None]) -> None:
        """Backends that record outside captures start (``history: always``); once the
        profiler holds this object: their notes name the role's identity."""
        self.release = standing.arm(plan, self.identity, self.settings, backend_of, outer,
                                    note)

    def let_go(self) -> None:
        """The role is off for good: the history kept for it ends."""
        if self.release is not None:
            self.release = self.release()
