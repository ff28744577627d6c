"""A composed verl trainer config -> a policy document, a comment per translated key, and
what has no equivalent. The rules follow what verl 0.9.1 itself does with each key
(``verl/utils/profiler/profile.py`` ``DistProfiler``, ``verl/trainer/ppo/ray_trainer.py``)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, NoReturn

from policy_engine.errors import Location, PolicyError, is_int, json_path
from policy_engine.integrations.verl_config import tools
from policy_engine.integrations.verl_config.engine import rollout_role
from policy_engine.integrations.verl_config.resolve import InterpolationError, Resolver
from policy_engine.integrations.verl_config.result import Conversion, PolicyPath, RoleBlock

#: verl's profiler blocks -> policy roles. The hybrid worker (``actor_rollout_ref``) runs under
#: the actor's block, ref and rollout colocated with it; the rollout's block drives the
#: inference engines' own profiler.
ROLE_BLOCKS: tuple[RoleBlock, ...] = (
    RoleBlock(
        "actor",
        "actor_rollout_ref.actor.profiler",
        ("actor_update", "actor_compute_log_prob", "ref_compute_log_prob"),
    ),
    RoleBlock("ref", "actor_rollout_ref.ref.profiler", ("ref_compute_log_prob",)),
    RoleBlock("critic", "critic.profiler", ("train_batch",), hybrid=False),
    RoleBlock("rollout", "actor_rollout_ref.rollout.profiler", engine=True),
)
ENGINES = ("vllm", "sglang")
_CAPTURE_KEYS = ("backend", "discrete", "merge_steps", "schedule")


class Locator:
    """Where a verl key was written: in the file, or by an override."""

    def __init__(
        self,
        locate: Any = None,
        overridden: Mapping[PolicyPath, Location] | None = None,
        origin: str = "<config>",
    ) -> None:
        self._locate = locate
        self._overridden = dict(overridden or {})
        self._origin = origin

    def __call__(self, dotted: str) -> Location:
        path = tuple(dotted.split("."))
        for end in range(len(path), 0, -1):
            if path[:end] in self._overridden:
                return self._overridden[path[:end]]
        if self._locate is not None:
            found: Location = self._locate(path)
            return found
        return Location(self._origin)


def convert(
    config: Mapping[str, Any], *, cwd: str | None = None, locate: Locator | None = None
) -> Conversion:
    """The policy equivalent to the profiling settings of ``config``, a composed verl
    trainer config as plain data (interpolations unresolved or resolved). A relative
    ``save_path`` is taken from ``cwd`` (default: the working directory).

    Raises PolicyError for values verl itself would refuse, located by ``locate``.
    """
    return _Converter(config, cwd or os.getcwd(), locate or Locator()).run()


class _Converter:
    def __init__(self, config: Mapping[str, Any], cwd: str, locate: Locator) -> None:
        self.cfg = Resolver(config)
        self.cwd = cwd
        self.locate = locate
        self.out = Conversion({"version": 1})

    def fail(self, key: str, message: str) -> NoReturn:
        raise PolicyError.single(message, self.locate(key), json_path(tuple(key.split("."))))

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self.cfg.get(key, default)
        except InterpolationError as err:
            self.fail(".".join(err.path) or key, str(err))

    def run(self) -> Conversion:
        policy = self.out.policy
        name = self.get("trainer.experiment_name")
        prefix = re.sub(r"[^0-9A-Za-z.=+-]+", "-", str(name)).strip("-") if name else ""
        policy["prefix"] = prefix or "verl"
        self.out.say(
            ("prefix",), "trainer.experiment_name" if prefix else "no trainer.experiment_name"
        )
        save_path = self.get("global_profiler.save_path") or "outputs/profile"
        policy["output_dir"] = self._absolute(str(save_path))
        self.out.say(
            ("output_dir",),
            f"global_profiler.save_path={save_path} (absolute: the "
            "folder verl's workers write to when launched from here)",
        )
        steps = self._steps()
        policy["roles"] = {}
        group = []
        for block in ROLE_BLOCKS:
            role = self._role(block, steps, policy["output_dir"])
            policy["roles"][block.role] = role
            if block.hybrid and role.get("enabled") and role.get("backend") not in ENGINES:
                group.append(block.role)
        colocated = self._colocated(group)
        if len(colocated) > 1:
            policy["colocate"] = [colocated]
            self.out.say(
                ("colocate",),
                "verl's hybrid worker (actor_rollout_ref) runs actor, "
                "ref and rollout in one process, under the actor's profiler block",
            )
        for role, spec in policy["roles"].items():
            spec.pop("_capture", None)
            if not spec.get("enabled"):
                policy["roles"][role] = {"enabled": False}
        self._unused()
        return self.out

    # -- global keys ------------------------------------------------------------------

    def _absolute(self, path: str) -> str:
        return os.path.normpath(os.path.join(self.cwd, os.path.expanduser(path)))

    def _steps(self) -> list[int]:
        steps = self.get("global_profiler.steps")
        if steps is None:
            self.out.say(("roles",), "global_profiler.steps=null: verl starts no profiled step")
            return []
        if not isinstance(steps, list) or any(
            not is_int(s) or s < 0 for s in steps
        ):
            self.fail(
                "global_profiler.steps",
                f"global_profiler.steps must be a list of steps >= 0, got {steps!r}",
            )
        return sorted(set(steps))

    def _unused(self) -> None:
        for key in ("finish_hook_cmd",):
            value = self.get(f"global_profiler.{key}")
            if value:
                self.out.unmapped.append(
                    f"global_profiler.{key}={value}: verl's finish hook keeps running under the "
                    "plugin; a policy has no command to run"
                )
        options = self.get("global_profiler.global_tool_config.nsys.controller_nsight_options")
        if self.get("global_profiler.tool") == "nsys" and options:
            self.out.unmapped.append(
                "global_profiler.global_tool_config.nsys.controller_nsight_options: the driver "
                "process under nsys is Ray's, outside any policy role"
            )

    # -- roles ------------------------------------------------------------------------

    def _role(self, block: RoleBlock, steps: list[int], output_dir: str) -> dict[str, Any]:
        key = block.block
        at: PolicyPath = ("roles", block.role)
        if not self.cfg.has(key):
            self.out.say(at, f"{key} is not in this config: the role is off")
            return {"enabled": False}
        enable = self.get(f"{key}.enable", False)
        if not isinstance(enable, bool):
            self.fail(f"{key}.enable", f"{key}.enable must be a boolean, got {enable!r}")
        tool_name = self.get(f"{key}.tool")
        if tool_name is None:
            self.out.say(at, f"{key}.tool (global_profiler.tool) is null: verl profiles nothing")
            return {"enabled": False}
        if block.role == "critic" and not self._needs_critic():
            self.out.say(
                at,
                "critic.enable is null and algorithm.adv_estimator is not gae: "
                "verl builds no critic worker",
            )
            return {"enabled": False}
        if block.engine:
            return rollout_role(self, block, enable, str(tool_name), steps)
        backend = tools.BACKENDS.get(str(tool_name))
        if backend is None:
            if enable:
                self.out.unmapped.append(
                    f"{key}.tool={tool_name}: no policy backend records "
                    f"what verl's {tool_name} tool does; role "
                    f"{block.role!r} is left off"
                )
            self.out.say(at, f"{key}.tool={tool_name}: no equivalent backend")
            return {"enabled": False}
        tool = self._tool(str(tool_name), key)
        save_path = self.get(f"{key}.save_path")
        if save_path is not None and self._absolute(str(save_path)) != output_dir and enable:
            self.out.unmapped.append(
                f"{key}.save_path={save_path}: one output_dir per policy; "
                f"role {block.role!r} writes under {output_dir}"
            )
        return self._worker_role(block, tool, enable or tool.history_always, enable, steps)

    def _needs_critic(self) -> bool:
        """verl's own rule (``verl.trainer.ppo.utils.need_critic``)."""
        enable = self.get("critic.enable")
        if enable is not None:
            return bool(enable)
        return bool(self.get("algorithm.adv_estimator") == "gae")

    def _tool(self, name: str, key: str) -> tools.Tool:
        tkey = f"{key}.tool_config.{name}"
        block = self.get(tkey) or {}
        if not isinstance(block, Mapping):
            self.fail(tkey, f"{tkey} must be a mapping, got {block!r}")
        if name == "torch":
            return tools.torch_tool(block, tkey, self.fail)
        if name == "npu":
            return tools.npu_tool(block, tkey, self.fail)
        if name == "nsys":
            okey = "global_profiler.global_tool_config.nsys.worker_nsight_options"
            return tools.nsys_tool(block, tkey, self.get(okey), okey, self.fail)
        return tools.memory_tool(block, tkey, self.fail)

    def _ranks(self, key: str, at: PolicyPath) -> Any:
        all_ranks = self.get(f"{key}.all_ranks", False)
        ranks = self.get(f"{key}.ranks") or []
        if not isinstance(ranks, list) or any(
            not is_int(r) or r < 0 for r in ranks
        ):
            self.fail(f"{key}.ranks", f"{key}.ranks must be a list of ranks >= 0, got {ranks!r}")
        if all_ranks:
            self.out.say((*at, "ranks"), f"{key}.all_ranks=true")
            return "all"
        if ranks:
            self.out.say((*at, "ranks"), f"{key}.ranks")
            return sorted(set(ranks))
        self.out.say((*at, "ranks"), f"{key}.ranks=[]: verl's default, rank 0")
        return [0]

    def _worker_role(
        self, block: RoleBlock, tool: tools.Tool, enabled: bool, planned: bool, steps: list[int]
    ) -> dict[str, Any]:
        key, at = block.block, ("roles", block.role)
        role: dict[str, Any] = {"enabled": enabled}
        self.out.say(
            (*at, "enabled"),
            f"{key}.enable={str(planned).lower()}"
            + (
                " (torch_memory watches for out-of-memory errors whatever enable says)"
                if enabled and not planned
                else ""
            ),
        )
        role["backend"] = tool.backend
        self.out.say((*at, "backend"), f"{key}.tool (verl's {_tool_of(tool.backend)})")
        role["ranks"] = self._ranks(key, at)
        role["steps"] = steps if planned else []
        self.out.say(
            (*at, "steps"),
            "global_profiler.steps"
            if planned
            else f"{key}.enable=false: no planned snapshot, out-of-memory ones only",
        )
        merge = bool(self.get("global_profiler.profile_continuous_steps", False))
        if merge and tool.discrete:
            self.out.say(
                (*at, "merge_steps"),
                "global_profiler.profile_continuous_steps is "
                "true, but discrete stages are their own captures in verl as here",
            )
        elif merge:
            self.out.say((*at, "merge_steps"), "global_profiler.profile_continuous_steps")
        role["merge_steps"] = merge and not tool.discrete
        role["discrete"] = tool.discrete
        if tool.backend != "memory":  # torch_memory has no discrete mode
            self.out.say((*at, "discrete"), f"{key}.tool_config.{_tool_of(tool.backend)}.discrete")
        role["schedule"] = tool.schedule
        if tool.schedule is not None:
            self.out.say(
                (*at, "schedule"),
                f"{key}.tool_config.torch.schedule (repeat 0 "
                "is one window per capture in verl's continuous trace)",
            )
        role["regions"] = self._regions(block, tool, at)
        role[tool.backend] = tool.settings
        for path, text in tool.notes:
            self.out.say((*at, *path), text)
        self.out.unmapped.extend(tool.unmapped if planned or enabled else [])
        role["_capture"] = {k: role.get(k) for k in _CAPTURE_KEYS} | {"settings": tool.settings}
        return role

    def _regions(self, block: RoleBlock, tool: tools.Tool, at: PolicyPath) -> Any:
        if tool.stage_schedule is None:
            self.out.say((*at, "regions"), "the stages verl marks with DistProfiler.annotate")
            return list(block.regions)
        regions: dict[str, Any] = {name: {} for name in block.regions}
        scheduled = "actor_update" if "actor_update" in regions else None
        if scheduled is None:
            self.out.unmapped.append(
                f"{block.block}.tool_config.torch.schedule: role "
                f"{block.role!r} has no scheduled stage in verl"
            )
            return list(block.regions)
        regions[scheduled] = {"schedule": tool.stage_schedule}
        self.out.say(
            (*at, "regions"),
            f"{block.block}.tool_config.torch.schedule applies to "
            "the scheduled stage (actor_update) only, every other stage whole",
        )
        return regions

    def _colocated(self, group: list[str]) -> list[str]:
        """The roles that can share the actor's captures: verl's hybrid worker records
        them under the actor's block, so one that asks for other capture settings keeps its
        own (it only matters to a ref worker of its own)."""
        roles = self.out.policy["roles"]
        actor = roles.get("actor", {})
        keep = []
        for name in group:
            spec = roles[name]
            same = (
                not spec.get("enabled")
                or not actor.get("enabled")
                or spec.get("backend") != actor.get("backend")
                or spec.get("_capture") == actor.get("_capture")
            )
            if same:
                keep.append(name)
            else:
                self.out.say(
                    ("roles", name),
                    "its capture settings differ from the actor's, so "
                    "it is not in colocate: in verl's hybrid worker the actor's block "
                    "records the ref stage",
                )
        return keep


def _tool_of(backend: str) -> str:
    return {v: k for k, v in tools.BACKENDS.items()}[backend]
