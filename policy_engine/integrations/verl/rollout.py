"""verl's vLLM rollout servers under the policy: the engine driver takes over the engine.

In agent-loop mode verl generates in vLLM engines of their own, one ``vLLMHttpServer``
Ray actor per replica (``verl/workers/rollout/vllm_rollout/vllm_async_server.py``). verl
launches the engine with its profiler configuration when ``_should_profile()`` holds and
calls the server's ``start_profile``/``stop_profile`` around the rollout of a profiled step.
With ``PROFILE_POLICY`` set and the policy's rollout role on the ``vllm`` backend, the
patched server:

- profiles the replicas the role's ``ranks`` select (``_should_profile``), launched with
  the profiler configuration ``policy-engine engine-args`` prints for the role
  (``build_vllm_profiler_args``), whatever verl's own rollout profiler block says;
- drives its engine with :func:`policy_engine.integrations.engines.apply_engine_policy`
  (``replica=`` the server's replica): ``start_profile`` enters ``atraining_step(n)``,
  ``stop_profile`` leaves it, so the role's ``steps`` decide which rollouts record and the
  engine's files land in the per-window layout and manifest. ``n`` is the step verl passes
  (``global_step``/``profile_step``), else the weights' version plus one (verl sets it
  with ``set_global_steps`` after each step's weight update, 0 before the first step).

A policy whose rollout role is not a vllm role leaves the engine unprofiled: verl's own
rollout profiler block does not apply under a policy. verl's SGLang server is not taken
over (its engine is driven through a tokenizer manager the engine driver does not speak
to); a policy with an sglang rollout says so once.
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import AbstractAsyncContextManager
from types import ModuleType
from typing import Any

from policy_engine.backends.engine.kind import staging_folder
from policy_engine.backends.vllm.checks import launch_config
from policy_engine.errors import is_int
from policy_engine.integrations.engines import (
    EngineProfiler,
    OffEngineProfiler,
    apply_engine_policy,
)
from policy_engine.integrations.verl import roles as verl_roles
from policy_engine.integrations.verl import switch
from policy_engine.language.load import ENV_FILE
from policy_engine.language.model import Policy
from policy_engine.language.rules import engine_layout as layout
from policy_engine.plan.compile import compile_plan
from policy_engine.plan.topology import Topology
from policy_engine.runtime.process.state import warn_once

log = logging.getLogger("policy_engine")

#: The attribute of a server holding its :class:`_Rollout`.
ATTR = "_policy_engine_rollout"
_PATCHED = "__policy_engine_patched__"


def engine_role(policy: Policy, backend: str) -> str | None:
    """The policy role verl's rollout replicas are, when it profiles on ``backend``."""
    role = verl_roles.assign(None, policy.roles).role
    spec = policy.role(role)
    return role if spec.enabled and spec.backend == backend else None


def replica_profiled(policy: Policy, role: str, replica: int) -> bool:
    """Whether the role's ``ranks`` select any rank of ``replica`` (its dp coordinate)."""
    mesh = policy.mesh_for(role) or None
    world = layout.world_of(mesh)
    if not 0 <= replica < layout.replicas(mesh):
        return False
    return any(compile_plan(policy, role, Topology.for_rank(r, world, mesh)).enabled
               for r in layout.ranks_of(replica, mesh))


def launch_args(policy: Policy, role: str) -> dict[str, str]:
    """What verl's ``build_vllm_profiler_args`` returns, for the policy's role: vLLM's
    ``--profiler-config`` as JSON, writing where the engine driver collects from."""
    spec = policy.role(role)
    folder = staging_folder(policy.output_dir, role, spec.settings["torch_profiler_dir"])
    return {"profiler_config": json.dumps(launch_config(spec.settings, spec.schedule, folder))}


class _Rollout:
    """One server's engine under the policy: its driver and the window now open (``role``
    empty: the server's engine is not profiled)."""

    def __init__(self, role: str, replica: int, raise_errors: bool = False) -> None:
        self.role = role
        self.replica = replica
        self.raise_errors = raise_errors
        self.who = f"verl's vLLM server of replica {replica}"
        self.driver: EngineProfiler | OffEngineProfiler | None = None
        self.window: AbstractAsyncContextManager[None] | None = None
        self.starts = 0

    def step_of(self, server: Any, kwargs: dict[str, Any]) -> int:
        self.starts += 1
        given = kwargs.get("global_step", kwargs.get("profile_step"))
        if is_int(given):
            return given
        version = getattr(server, "global_steps", None)
        if is_int(version):
            return version + 1
        return self.starts

    async def start(self, server: Any, kwargs: dict[str, Any]) -> None:
        n = self.step_of(server, kwargs)
        if self.window is not None:
            await self.stop()
        try:
            if self.driver is None:
                self.driver = apply_engine_policy(server.engine, self.role, replica=self.replica)
            window = self.driver.atraining_step(n)
            await window.__aenter__()
        except Exception as err:
            self._failed(err)
            return
        self.window = window

    async def stop(self) -> None:
        window, self.window = self.window, None
        if window is None:
            return
        try:
            await window.__aexit__(None, None, None)
        except Exception as err:
            self._failed(err)

    def _failed(self, err: Exception) -> None:
        """The driver could not be made or raised (``on_error: raise``): raise under
        ``raise``, else the plugin is off in this process from now on (said once)."""
        if self.raise_errors:
            raise err
        switch.turn_off(self.who, f"role {self.role!r}: {switch.failure(err)}")
        self.role = ""


def _engine_role(policy: Policy, backend: str, who: str) -> str | None:
    """:func:`engine_role`, or None when it cannot be told (a malformed
    ``PROFILE_POLICY_VERL_ROLES``): then the plugin is off, unless ``defaults`` says
    ``on_error: raise``."""
    try:
        return engine_role(policy, backend)
    except Exception as err:
        if switch.raises(policy, ""):
            raise
        switch.turn_off(who, switch.failure(err))
        return None


def _rollout_of(server: Any) -> _Rollout | None:
    """The server's rollout under the policy (None: no ``PROFILE_POLICY``, verl profiles
    as it does; a rollout without a role when the plugin is off or the server's engine
    is not profiled)."""
    found = getattr(server, ATTR, None)
    if found is not None:
        return found  # type: ignore[no-any-return]
    if not os.environ.get(ENV_FILE):
        return None
    rollout = _Rollout("", int(getattr(server, "replica_rank", 0)))
    policy = switch.policy(rollout.who)
    role = None if policy is None else _engine_role(policy, "vllm", rollout.who)
    if policy is not None and role is not None:
        try:
            if replica_profiled(policy, role, rollout.replica):
                rollout = _Rollout(role, rollout.replica, switch.raises(policy, role))
        except Exception as err:
            if switch.raises(policy, role):
                raise
            switch.turn_off(rollout.who, f"role {role!r}: {switch.failure(err)}")
    setattr(server, ATTR, rollout)
    return rollout


def patch_vllm_server(module: ModuleType) -> None:
    """Patch ``vLLMHttpServer`` and the module's ``build_vllm_profiler_args`` (once)."""
    cls = getattr(module, "vLLMHttpServer", None)
    build = getattr(module, "build_vllm_profiler_args", None)
    if cls is None or build is None or getattr(cls, _PATCHED, False):
        return
    should, start, stop = cls._should_profile, cls.start_profile, cls.stop_profile

    def _should_profile(self: Any) -> bool:
        rollout = _rollout_of(self)
        return should(self) if rollout is None else bool(rollout.role)

    def build_vllm_profiler_args(config: Any, tool_config: Any, rank: int,
                                 legacy_env: bool = True) -> dict[str, Any]:
        if not os.environ.get(ENV_FILE):
            return build(config, tool_config, rank, legacy_env=legacy_env)  # type: ignore[no-any-return]
        who = f"verl's vLLM server of rank {rank}"
        policy = switch.policy(who)
        role = None if policy is None else _engine_role(policy, "vllm", who)
        if policy is None or role is None:
            return {}  # verl's own rollout profiler block does not apply under a policy
        try:
            return launch_args(policy, role)
        except Exception as err:
            if switch.raises(policy, role):
                raise
            switch.turn_off(who, f"role {role!r}: {switch.failure(err)}")
            return {}

    async def start_profile(self: Any, **kwargs: Any) -> None:
        rollout = _rollout_of(self)
        if rollout is None:
            return await start(self, **kwargs)  # type: ignore[no-any-return]
        if getattr(self, "node_rank", 0) != 0 or not rollout.role or switch.is_off():
            return None
        await rollout.start(self, kwargs)
        return None

    async def stop_profile(self: Any) -> None:
        rollout = _rollout_of(self)
        if rollout is None:
            return await stop(self)  # type: ignore[no-any-return]
        await rollout.stop()
        return None

    for name, new, old in (("_should_profile", _should_profile, should),
                           ("start_profile", start_profile, start),
                           ("stop_profile", stop_profile, stop)):
        new.__doc__, new.__name__, new.__qualname__ = old.__doc__, name, old.__qualname__
        setattr(cls, name, new)
    module.build_vllm_profiler_args = build_vllm_profiler_args  # type: ignore[attr-defined]
    setattr(cls, _PATCHED, True)


def patch_sglang_server(module: ModuleType) -> None:
    """verl's SGLang server is not taken over: say so once when the policy asks for it."""
    who = "verl's SGLang server"
    policy = switch.policy(who)
    role = None if policy is None else _engine_role(policy, "sglang", who)
    if role is not None:
        warn_once(("verl-sglang",),
                  "policy-engine: verl's SGLang rollout servers are not driven by the policy "
                  "(role %r): profile SGLang engines with policy_engine.integrations.engines."
                  "apply_engine_policy, or profile the rollout with vLLM", role)
