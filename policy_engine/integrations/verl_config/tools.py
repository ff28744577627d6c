"""One verl profiler tool's settings as a policy backend's: ``tool_config.<tool>`` of a role,
with what verl does with each value (``verl/utils/profiler/*_profile.py``, verl 0.9.1)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from policy_engine.errors import is_int

#: verl tool -> policy backend, for the tools a worker process runs.
BACKENDS = {"torch": "torch", "npu": "mstx", "nsys": "nsight", "torch_memory": "memory"}
#: What each tool's ``contents`` may hold (verl's own checks).
CONTENTS = {
    "torch": ("cuda", "cpu", "memory", "shapes", "stack"),
    "npu": ("npu", "cpu", "memory", "shapes", "module", "stack"),
}
NPU_LEVELS = ("level_none", "level0", "level1", "level2")
SCHEDULE_KEYS = ("skip_first", "wait", "warmup", "active", "repeat")
#: nsys options the engine sets itself (settings/nsight.py refuses them in `options`).
NSYS_SET_BY_ENGINE = (
    "capture-range",
    "capture-range-end",
    "nvtx-capture",
    "output",
    "force-overwrite",
    "kill",
)

Fail = Callable[[str, str], Any]  # (verl key, message) -> raises
Say = Callable[[tuple[str, ...], str], None]  # (policy path, comment)


@attrs.define
class Tool:
    """A role's capture settings, from one verl tool."""

    backend: str
    settings: dict[str, Any]
    discrete: bool = False
    schedule: dict[str, int] | None = None
    #: discrete mode: the schedule of verl's scheduled stage (actor_update), None elsewhere
    stage_schedule: dict[str, int] | None = None
    #: torch_memory: verl's history is on from the worker's start, planned snapshots aside
    history_always: bool = False
    notes: list[tuple[tuple[str, ...], str]] = attrs.field(factory=list)
    unmapped: list[str] = attrs.field(factory=list)


def contents_of(block: Mapping[str, Any], tool: str, key: str, fail: Fail) -> list[str]:
    contents = block.get("contents")
    contents = [] if contents is None else contents
    if not isinstance(contents, list):
        fail(f"{key}.contents", f"{key}.contents must be a list, got {contents!r}")
    for i, item in enumerate(contents):
        if item not in CONTENTS[tool]:
            fail(
                f"{key}.contents",
                f"{key}.contents[{i}]: {item!r} is not one of verl's "
                f"{tool} contents ({', '.join(CONTENTS[tool])})",
            )
    return list(contents)


def _count(block: Mapping[str, Any], name: str, key: str, fail: Fail) -> int:
    value = block.get(name, 0)
    value = 0 if value is None else value
    if not is_int(value) or value < 0:
        fail(f"{key}.{name}", f"{key}.{name} must be an integer >= 0, got {value!r}")
    return int(value)


def _flag(block: Mapping[str, Any], name: str, key: str, fail: Fail) -> bool:
    value = block.get(name, False)
    if not isinstance(value, bool):
        fail(f"{key}.{name}", f"{key}.{name} must be a boolean, got {value!r}")
    return bool(value)


def torch_tool(block: Mapping[str, Any], key: str, fail: Fail) -> Tool:
    contents = contents_of(block, "torch", key, fail)
    cuda = not contents or "cuda" in contents
    settings = {
        "activities": ["cpu", "cuda"] if cuda else ["cpu"],
        "record_shapes": "shapes" in contents,
        "profile_memory": "memory" in contents,
        "with_stack": "stack" in contents,
    }
    tool = Tool("torch", settings, discrete=_flag(block, "discrete", key, fail))
    shown = "[]" if not contents else "[" + ", ".join(contents) + "]"
    tool.notes.append(
        (
            ("torch", "activities"),
            (
                f"{key}.contents={shown}: verl records CPU always and CUDA "
                + (
                    "because contents is empty or lists cuda"
                    if cuda
                    else "only when contents lists it"
                )
                + "; shapes -> record_shapes, memory -> profile_memory, stack -> with_stack"
            ),
        )
    )
    raw = block.get("schedule")
    if isinstance(raw, Mapping):
        counts = {name: _count(raw, name, f"{key}.schedule", fail) for name in SCHEDULE_KEYS}
        if counts["active"] > 0:
            if tool.discrete:
                tool.stage_schedule = counts
            else:
                # verl's continuous trace keeps one window per start_profile unless repeat is set.
                tool.schedule = dict(counts, repeat=counts["repeat"] or 1)
    _token_window(block, key, tool)
    return tool


def _token_window(block: Mapping[str, Any], key: str, tool: Tool) -> None:
    """``profile_token_*`` in a training worker's block: listed, as verl ignores it there."""
    for name in ("profile_token_start", "profile_token_end"):
        if block.get(name) is not None:
            tool.unmapped.append(
                f"{key}.{name}={block[name]}: verl reads it for rollout "
                "engines only; a training worker ignores it"
            )


def npu_tool(block: Mapping[str, Any], key: str, fail: Fail) -> Tool:
    contents = contents_of(block, "npu", key, fail)
    level = block.get("level", "level0")
    if level not in NPU_LEVELS:
        fail(f"{key}.level", f"{key}.level: {level!r} is not one of {', '.join(NPU_LEVELS)}")
    settings = {
        "level": level,
        "activities": ["cpu", "npu"] if "npu" in contents else ["cpu"],
        "record_shapes": "shapes" in contents,
        "profile_memory": "memory" in contents,
        "with_stack": "stack" in contents,
        "with_modules": "module" in contents,
        "analysis": _flag(block, "analysis", key, fail),
        # What verl's get_npu_profiler always passes to torch_npu.
        "export_type": "db",
        "data_simplification": True,
        "ranges": True,
        "mstx_domain_exclude": ["communication"],
    }
    tool = Tool("mstx", settings, discrete=_flag(block, "discrete", key, fail))
    shown = "[]" if not contents else "[" + ", ".join(contents) + "]"
    tool.notes.append(
        (
            ("mstx", "activities"),
            (
                f"{key}.contents={shown}: verl records CPU always and NPU only when contents "
                "lists npu; shapes/memory/stack/module -> record_shapes/profile_memory/with_stack/"
                "with_modules; export_type db, data_simplification, mstx ranges and "
                "mstx_domain_exclude [communication] are what verl passes to torch_npu"
            ),
        )
    )
    _token_window(block, key, tool)
    return tool


def nsys_tool(
    block: Mapping[str, Any],
    key: str,
    worker_options: Mapping[str, Any] | None,
    options_key: str,
    fail: Fail,
) -> Tool:
    options: dict[str, Any] = {}
    unmapped: list[str] = []
    for name, value in (worker_options or {}).items():
        if name in NSYS_SET_BY_ENGINE and value is not None:
            unmapped.append(
                f"{options_key}.{name}={value}: the engine sets it from the plan "
                "(nsight.capture and capture_range_end: auto)"
            )
        elif value is not None:
            options[str(name)] = value if isinstance(value, (str, int, bool)) else str(value)
    options.setdefault("trace", "cuda,nvtx")
    settings = {"capture": "cuda_profiler_api", "options": options}
    tool = Tool("nsight", settings, discrete=_flag(block, "discrete", key, fail))
    tool.notes.append(
        (
            ("nsight", "capture"),
            (
                "verl starts and stops nsys with torch.cuda.profiler.start/stop "
                f"(cudaProfilerApi); options: {options_key}"
            ),
        )
    )
    tool.unmapped.extend(unmapped)
    return tool


def memory_tool(block: Mapping[str, Any], key: str, fail: Fail) -> Tool:
    entries = block.get("trace_alloc_max_entries", 100_000)
    if not is_int(entries) or entries <= 0:
        fail(
            f"{key}.trace_alloc_max_entries",
            f"{key}.trace_alloc_max_entries must be a positive integer, got {entries!r}",
        )
    settings = {
        "max_entries": entries,
        "stacks": "all",
        "context": "all",
        "history": "always",
        "on_oom": True,
    }
    tool = Tool("memory", settings, history_always=True)
    tool.notes.append(
        (
            ("memory", "history"),
            (
                "verl's torch_memory records allocator history from the worker's start "
                "(stacks and context all) and writes a snapshot at an out-of-memory error on "
                "the selected ranks"
            ),
        )
    )
    tool.notes.append((("memory", "max_entries"), f"{key}.trace_alloc_max_entries"))
    depth = block.get("stack_depth", 32)
    if depth != 32:
        tool.unmapped.append(
            f"{key}.stack_depth={depth}: the allocator keeps whole stacks "
            "(torch's _record_memory_history has no depth)"
        )
    steps = block.get("memory_snapshot_num_steps", 1)
    if steps not in (1, None):
        tool.unmapped.append(
            f"{key}.memory_snapshot_num_steps={steps}: a snapshot covers one "
            "profiled step here (merge_steps joins consecutive steps only)"
        )
    return tool
