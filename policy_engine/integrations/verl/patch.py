"""verl's ``DistProfiler`` handed to the policy: its class patched once per process.

``__init__`` still runs verl's own (rank selection, finish-hook ranks, ``save_file_prefix``)
but without verl's tool, whose construction has effects of its own (``torch_memory``
turns allocator history on, ``npu`` imports torch_npu); nsys keeps its tool, which
verl's relocation of the reports needs. The driver is kept on the instance; ``start``,
``stop``, ``step`` and the stage decorator go to it. ``stop`` then runs verl's finish
hook (relocation and the user's command) on the ranks verl chooses, as verl does.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from policy_engine import settings as registry
from policy_engine.errors import PolicyError, closest
from policy_engine.integrations._driver import place
from policy_engine.integrations.verl import driver as verl_driver
from policy_engine.integrations.verl import roles as verl_roles
from policy_engine.integrations.verl import switch
from policy_engine.integrations.verl.driver import Forward, VerlDriver, outer_driver
from policy_engine.language.load import ENV_FILE
from policy_engine.language.model import Policy
from policy_engine.plan.topology import Topology
from policy_engine.runtime.apply import Profiler, profile_session
from policy_engine.runtime.process.state import warn_once

log = logging.getLogger("policy_engine")
#: The takeover line is INFO, and verl sets the root logger to WARNING: this logger says
#: INFO unless the user set its level (``logging.getLogger("policy_engine.verl")``).
said = logging.getLogger("policy_engine.verl")

#: The attribute of a DistProfiler holding its driver.
ATTR = "_policy_engine"
#: verl tools whose construction the plugin keeps (harmless, and their files need it).
KEEP_TOOL = frozenset({"nsys"})
_PATCHED = "__policy_engine_patched__"


class _WithoutTool:
    """verl's profiler config seen without its tool, for verl's ``__init__``."""

    tool = None

    def __init__(self, config: Any) -> None:
        self._config = config

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)


def unsupported(config: Any, tool_config: Any) -> list[str]:
    """What verl's profiler config asks that a policy cannot say (empty: nothing)."""
    found: list[str] = []
    if not getattr(config, "enable", False):
        return found  # a profiler verl leaves off asks nothing
    if getattr(config, "tool", None) == "precision_debugger":
        found.append("tool precision_debugger (msprobe's precision dumps) has no backend "
                     "in the policy language")
    for key in ("profile_token_start", "profile_token_end"):
        if getattr(tool_config, key, None) is not None:
            found.append(f"{key} (a window of response tokens in the rollout engine) has "
                         "no equivalent in the policy language")
    return found


def _worker_of(frame_depth: int = 2) -> str:
    """The class of the verl worker building a profiler (for the log line)."""
    frame = sys._getframe(frame_depth)
    owner = frame.f_locals.get("self")
    return type(owner).__name__ if owner is not None else frame.f_code.co_name


def _world(rank: int) -> int:
    world = Topology.discover().world
    return max(world, rank + 1)


def _off(name: str) -> VerlDriver:
    """The driver of a profiler the plugin leaves off: it records nothing, and verl's own
    tool is not built either (the user asked for the policy, not for verl's settings)."""
    return VerlDriver(name, name, {})


def _typo(policy: Policy, given: verl_roles.Assignment) -> str | None:
    """What to say when the worker's role is missing from the policy because a role the
    policy does name looks like a misspelling of it (None: it is not)."""
    if policy.unknown_role(given.role) in (None, ""):
        return None
    close = closest(given.role, policy.roles)
    return (f"the worker's policy role is {given.role!r} (by {given.how}), which the policy "
            f"does not name; the policy's role {close!r} looks like a misspelling of it "
            f"(did you mean {given.role!r}?): rename it {given.role!r}, or map the worker "
            f"with {verl_roles.ENV_ROLES}={given.worker}={close}")


def take_over(rank: int, save_file_prefix: str | None, config: Any,
              tool_config: Any, worker_class: str) -> VerlDriver | Forward | None:
    """The driver of a DistProfiler verl builds now (None: no policy, verl profiles as it
    does). A failure turns the plugin off in the process (:mod:`.switch`), or propagates
    under ``on_error: raise``."""
    if not os.environ.get(ENV_FILE):
        return None
    name = save_file_prefix or verl_roles.UNNAMED
    who = f"verl worker {name!r} ({worker_class}, rank {rank})"
    policy = switch.policy(who)
    if policy is None:
        return _off(name)
    role = ""  # until the worker's role is known, `defaults` says what a failure does
    try:
        given = verl_roles.assign(save_file_prefix, policy.roles)
        role = given.role
        typo = _typo(policy, given)
        if typo is not None:
            raise PolicyError.single(typo, path=f"$.roles.{closest(role, policy.roles)}")
        return _drive(policy, given, rank, config, tool_config, worker_class)
    except Exception as err:
        if switch.raises(policy, role):
            raise
        switch.turn_off(who, switch.failure(err))
        verl_driver.close_all(err)
        return _off(name)


def _drive(policy: Policy, given: verl_roles.Assignment, rank: int, config: Any,
           tool_config: Any, worker_class: str) -> VerlDriver | Forward:
    """The driver of worker ``given`` under a policy that loaded."""
    problems = unsupported(config, tool_config)
    if problems:
        raise ValueError(
            f"verl's profiler config asks for what the policy cannot express: "
            f"{'; '.join(problems)}; remove it from verl's profiler config or unset "
            f"{ENV_FILE}")
    if given.worker in verl_roles.INNER and outer_driver() is not None:
        _say(("verl-inner", given.worker), "policy-engine: verl's inner %r profiler "
             "(%s) hands its mini-batch steps and stages to its outer worker's role",
             given.worker, worker_class)
        return Forward(given.worker)
    raise_errors = switch.raises(policy, given.role)
    if policy.role(given.role).backend in registry.ENGINES:
        _say(("verl-engine", given.worker, given.role),
             "policy-engine: verl worker %r (%s) is policy role %r, whose backend %s runs in "
             "the inference engine: this profiler records nothing; verl's vLLM server "
             "profiles its engine under the role (docs/verl.md)",
             given.worker, worker_class, given.role, policy.role(given.role).backend)
        return VerlDriver(given.worker, given.role, {})
    topology = place(rank, _world(rank))
    names = [given.role, *(r for r in given.colocated
                           if policy.role(r).enabled
                           and policy.role(r).backend not in registry.ENGINES)]
    profilers: dict[str, Profiler] = {
        name: profile_session(policy, name, topology) for name in names}
    _say(("verl-worker", given.worker, given.role),
         "policy-engine: verl worker %r (%s, rank %d) is profiled as policy role %r%s "
         "(by %s), policy %s", given.worker, worker_class, rank, given.role,
         f" with {', '.join(names[1:])} in its windows" if names[1:] else "", given.how,
         policy.source)
    return VerlDriver(given.worker, given.role, profilers,
                      who=f"verl worker {given.worker!r} ({worker_class}, rank {rank})",
                      raise_errors=raise_errors)


def _say(key: object, message: str, *args: object) -> None:
    """Log at INFO the first time ``key`` is seen in this process (the plugin's logger is
    set to INFO where nothing set it, so that the line shows)."""
    if said.level == logging.NOTSET:
        said.setLevel(logging.INFO)
    warn_once(key, message, *args, level=logging.INFO, logger=said)


def driver_of(profiler: Any) -> VerlDriver | Forward | None:
    """The policy's driver of a verl profiler (None: verl's own profiling)."""
    return getattr(profiler, ATTR, None) if profiler is not None else None


def patch_profile_module(module: ModuleType) -> None:
    """Patch ``verl.utils.profiler.profile.DistProfiler`` (once)."""
    cls = getattr(module, "DistProfiler", None)
    if cls is None or getattr(cls, _PATCHED, False):
        return
    init, start, stop, step = cls.__init__, cls.start, cls.stop, cls.step
    annotate = cls.__dict__["annotate"].__func__

    @functools.wraps(init)
    def __init__(self: Any, rank: int, config: Any = None, tool_config: Any = None,
                 save_file_prefix: str | None = None, **kwargs: Any) -> None:
        worker = _worker_of()
        setattr(self, ATTR, None)
        driver = take_over(rank, save_file_prefix, config,
                           getattr(config, "tool_config", None) if tool_config is None
                           else tool_config, worker)
        if driver is None or config is None or getattr(config, "tool", None) in KEEP_TOOL:
            init(self, rank, config, tool_config, save_file_prefix, **kwargs)
        else:
            init(self, rank, _WithoutTool(config), tool_config, save_file_prefix, **kwargs)
            self.config = config
            self._tool = getattr(config, "tool", None)
        setattr(self, ATTR, driver)

    @functools.wraps(start)
    def start_(self: Any, **kwargs: Any) -> Any:
        driver = driver_of(self)
        if driver is None:
            return start(self, **kwargs)
        driver.start(**kwargs)
        return None

    @functools.wraps(stop)
    def stop_(self: Any, run_command: bool = True) -> Any:
        driver = driver_of(self)
        if driver is None:
            return stop(self, run_command=run_command)
        driver.stop()
        if self.check_enable():  # verl's finish hook, on the ranks verl picks
            self._run_finish_hook(run_command=run_command)
        return None

    @functools.wraps(step)
    def step_(self: Any) -> Any:
        driver = driver_of(self)
        if driver is None:
            return step(self)
        driver.step()
        return None

    def annotate_(klass: Any, /, message: str | None = None, color: str | None = None,
                  domain: str | None = None, category: str | None = None,
                  **kwargs_outer: Any) -> Callable[[Any], Any]:
        verl_decorator = annotate(klass, message, color, domain, category, **kwargs_outer)

        def decorator(func: Any) -> Any:
            verl_wrapped = verl_decorator(func)
            stage = kwargs_outer.get("role") or func.__name__

            @functools.wraps(func)
            def wrapper(self_instance: Any, *args: Any, **kwargs: Any) -> Any:
                driver = driver_of(getattr(self_instance, "profiler", None))
                if driver is None:
                    return verl_wrapped(self_instance, *args, **kwargs)
                # verl's wrapper still runs (its tracking lane); its own profiler is
                # never started, so it calls the stage as is.
                return driver.run_stage(stage, verl_wrapped, (self_instance, *args), kwargs)
            return wrapper
        return decorator

    annotate_.__doc__ = annotate.__doc__
    cls.__init__ = __init__
    cls.start, cls.stop, cls.step = start_, stop_, step_
    cls.annotate = classmethod(annotate_)
    setattr(cls, _PATCHED, True)
