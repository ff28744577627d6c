"""verl's rollout profiler block -> a policy role driven through the inference engine.

verl profiles a rollout replica's engine (``vllm_async_server.py``, ``async_sglang_server``)
when the rollout block is enabled, its tool is torch and ``discrete`` is true; ``ranks`` are
global GPU ranks, each selecting the whole replica that holds it
(``build_rollout_dist_profiler``), rank 0's replica by default.
"""

from __future__ import annotations

from typing import Any, NoReturn, Protocol

from policy_engine.errors import is_int
from policy_engine.integrations.verl_config.result import Conversion, RoleBlock
from policy_engine.integrations.verl_config.tools import contents_of


class Reader(Protocol):
    """What the rollout's rules read the config through (the converter)."""

    out: Conversion

    def get(self, key: str, default: Any = None) -> Any: ...

    def fail(self, key: str, message: str) -> NoReturn: ...


def _size(conv: Reader, key: str) -> int:
    value = conv.get(key, 1)
    value = 1 if value is None else value
    if not is_int(value) or value < 1:
        conv.fail(key, f"{key} must be an integer >= 1, got {value!r}")
    return int(value)


def rollout_role(
    conv: Reader, block: RoleBlock, enable: bool, tool: str, steps: list[int]
) -> dict[str, Any]:
    """The ``rollout`` role; off (with the reason as its comment) where verl records nothing."""
    key, at = block.block, ("roles", block.role)
    engine = conv.get("actor_rollout_ref.rollout.name")
    if not enable:
        conv.out.say(at, f"{key}.enable=false")
        return {"enabled": False}
    if tool not in ("torch", "npu"):
        conv.out.say(
            at,
            f"{key}.tool={tool}: verl drives a rollout engine's profiler with "
            "torch or npu only, so it records nothing here",
        )
        return {"enabled": False}
    tkey = f"{key}.tool_config.{tool}"
    settings = conv.get(tkey) or {}
    if not settings.get("discrete", False):
        conv.out.say(
            at,
            f"{tkey}.discrete=false: verl drives a rollout engine's profiler in "
            "discrete mode only, so it records nothing here",
        )
        return {"enabled": False}
    if tool != "torch" or engine not in ("vllm", "sglang"):
        conv.out.unmapped.append(
            f"{key}: verl's {tool} profiler inside the rollout engine "
            f"(actor_rollout_ref.rollout.name={engine}) has no policy backend (the engine "
            "backends record with torch in vLLM and SGLang); role 'rollout' is off"
        )
        conv.out.say(at, f"{key}.tool={tool}, rollout.name={engine}: no equivalent")
        return {"enabled": False}
    contents = contents_of(settings, "torch", tkey, conv.fail)
    rkey = "actor_rollout_ref.rollout"
    replica = (
        _size(conv, f"{rkey}.tensor_model_parallel_size")
        * _size(conv, f"{rkey}.data_parallel_size")
        * _size(conv, f"{rkey}.pipeline_model_parallel_size")
    )
    world = _size(conv, "trainer.n_gpus_per_node") * _size(conv, "trainer.nnodes")
    if world % replica:
        conv.fail(
            f"{rkey}.tensor_model_parallel_size",
            f"the rollout's replicas of {replica} GPUs do not divide the "
            f"{world} GPUs of trainer.n_gpus_per_node x trainer.nnodes",
        )
    role: dict[str, Any] = {
        "enabled": True,
        "backend": engine,
        "mesh": {"dp": world // replica, "tp": replica},
    }
    conv.out.say(
        (*at, "backend"),
        f"actor_rollout_ref.rollout.name={engine}: the engine's "
        "own torch profiler, driven by policy_engine.integrations.engines",
    )
    conv.out.say(
        (*at, "mesh"),
        "one dp entry per rollout replica of tensor x data x pipeline "
        "parallel GPUs, over trainer.n_gpus_per_node x trainer.nnodes",
    )
    ranks = conv.get(f"{key}.ranks") or []
    if conv.get(f"{key}.all_ranks", False):
        role["ranks"] = "all"
        conv.out.say((*at, "ranks"), f"{key}.all_ranks=true")
    else:
        replicas = sorted({int(r) // replica for r in ranks}) or [0]
        role["ranks"] = {"dp": replicas}
        conv.out.say(
            (*at, "ranks"),
            f"{key}.ranks={ranks}: the replicas holding those GPUs "
            "(verl profiles whole replicas; rank 0's when empty)",
        )
    role["steps"] = steps
    conv.out.say((*at, "steps"), "global_profiler.steps: one engine window per profiled step")
    start = settings.get("profile_token_start")
    end = settings.get("profile_token_end")
    if end is not None and engine == "sglang" and start:
        conv.out.unmapped.append(
            f"{tkey}.profile_token_start={start}: SGLang counts forward "
            "passes from its own start, which the driver cannot see"
        )
    elif end is not None:
        role["schedule"] = {
            "skip_first": int(start or 0),
            "active": int(end) - int(start or 0),
            "repeat": 1,
        }
        conv.out.say(
            (*at, "schedule"),
            f"{tkey}.profile_token_start/profile_token_end: "
            "engine iterations skipped, then recorded",
        )
    elif start:
        conv.out.unmapped.append(
            f"{tkey}.profile_token_start={start} without an end: a "
            "schedule needs the number of iterations to record"
        )
    stack = "stack" in contents or "module" in contents
    if engine == "vllm":
        role["vllm"] = {
            "torch_profiler_with_stack": stack,
            "torch_profiler_record_shapes": "shapes" in contents,
            "torch_profiler_with_memory": "memory" in contents,
        }
    else:
        role["sglang"] = {"with_stack": stack, "record_shapes": "shapes" in contents}
        if "memory" in contents:
            conv.out.unmapped.append(
                f"{tkey}.contents memory: SGLang's profiler has no "
                "memory profiling (verl ignores it too)"
            )
    conv.out.say(
        (*at, engine),
        f"{tkey}.contents: stack/module -> with_stack, shapes -> "
        "record_shapes" + (", memory -> with_memory" if engine == "vllm" else ""),
    )
    if conv.get(f"{key}.relocate_results", False):
        conv.out.say(
            (*at, "enabled"),
            f"{key}.relocate_results: the driver files the engine's "
            "traces into the policy's layout itself",
        )
    return role
