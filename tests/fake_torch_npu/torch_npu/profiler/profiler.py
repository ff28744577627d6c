"""The fake ``torch_npu.profiler.profiler``: profile, tensorboard_trace_handler, analyse.

It keeps the real package's process-wide state: the handler sets the output folder and
worker name when it is *constructed*, ``profile.start()`` without a handler switches to a
throw-away folder, and only one profiler can be initialized at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from .._C._profiler import ProfilerActivity
from .._fake import record, warn
from .experimental_config import _ExperimentalConfig
from .scheduler import ProfilerAction

__all__ = ["analyse", "profile", "supported_activities", "tensorboard_trace_handler"]

MAX_WORKER_NAME_LENGTH = 226
_state: dict[str, Any] = {}


def _reset_state() -> None:
    _state.update(worker_name=None, dir_name=None, export_only=False, owner=None)


_reset_state()


def supported_activities() -> set[ProfilerActivity]:
    return {ProfilerActivity.CPU, ProfilerActivity.NPU}


def tensorboard_trace_handler(
    dir_name: str | None = None,
    worker_name: str | None = None,
    analyse_flag: bool = True,
    async_mode: bool = False,
) -> Callable[[Any], None]:
    record("tensorboard_trace_handler", dict(dir_name=dir_name, worker_name=worker_name,
           analyse_flag=analyse_flag, async_mode=async_mode))  # fmt: skip
    if worker_name is not None and not (
        isinstance(worker_name, str) and 0 < len(worker_name) < MAX_WORKER_NAME_LENGTH
    ):
        warn("Invalid parameter worker_name, reset it to default.")
        worker_name = None
    _state.update(worker_name=worker_name, dir_name=dir_name, export_only=False)

    def handler_fn(prof_inst: Any) -> None:
        if analyse_flag:
            prof_inst.prof_if.analyse(async_mode=async_mode)

    return handler_fn


def analyse(profiler_path: str, max_process_number: int = 1, export_type: Any = None) -> None:
    record("analyse", profiler_path, export_type)


class _ProfInterface:
    """Where the fake 'collects': one folder per init, a small file per stage."""

    def __init__(self, owner: profile) -> None:
        self.owner = owner
        self.prof_path = ""

    def init_trace(self) -> None:
        if _state["owner"] not in (None, self):
            record("error", "the NPU profiler is already initialized in this process")
            return
        base = _state["dir_name"] or os.getcwd()
        if _state["export_only"]:  # the real one deletes this folder after analysis
            base = os.path.join(os.getcwd(), "export_only_prof_dir")
        worker = _state["worker_name"] or socket.gethostname()
        stamp = datetime.now().strftime("%Y%m%d%H%M%S%f")[:-3]
        self.prof_path = os.path.join(base, f"{worker}_{os.getpid()}_{stamp}_ascend_pt")
        os.makedirs(self.prof_path, exist_ok=True)  # the real one reuses an existing folder
        _state["owner"] = self

    def _write(self, name: str, data: Any) -> None:
        if self.prof_path:
            path = os.path.join(self.prof_path, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(data, f)

    def warmup_trace(self) -> None:
        record("trace", "warmup", self.prof_path)

    def start_trace(self) -> None:
        record("trace", "start", self.prof_path)

    def stop_trace(self) -> None:
        record("trace", "stop", self.prof_path)
        self._write("FRAMEWORK/torch.op_range", {"steps": self.owner.step_num})

    def finalize_trace(self) -> None:
        record("trace", "finalize", self.prof_path)
        owner = self.owner
        # the real one writes the schedule's and config's __dict__ as JSON
        config = {
            "schedule": getattr(owner.schedule, "__dict__", {}),
            "experimental_config": dict(vars(owner.experimental_config or object())),
        }
        self._write("profiler_info.json", config)
        if owner.metadata:
            self._write("profiler_metadata.json", owner.metadata)
        if _state["owner"] is self:
            _state["owner"] = None

    def delete_prof_dir(self) -> None:
        record("trace", "delete", self.prof_path)
        shutil.rmtree(self.prof_path, ignore_errors=True)

    def analyse(self, async_mode: bool = False) -> None:
        record("trace", "analyse", self.prof_path)
        # what the real one writes: a trace_view.json, here the real one of one rank
        # (tests/data/external/ascend), which the reading side's answers are checked on
        real = os.path.join(os.path.dirname(__file__), *[os.pardir] * 3, "data", "external",
                            "ascend", "trace_view.json")
        if os.path.isfile(real):
            with open(real, "rb") as f:
                self._write_bytes("ASCEND_PROFILER_OUTPUT/trace_view.json", f.read())
        else:
            self._write("ASCEND_PROFILER_OUTPUT/trace_view.json", [])

    def _write_bytes(self, name: str, data: bytes) -> None:
        if self.prof_path:
            path = os.path.join(self.prof_path, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)


_N, _W, _R, _S = (ProfilerAction.NONE, ProfilerAction.WARMUP, ProfilerAction.RECORD,
                  ProfilerAction.RECORD_AND_SAVE)  # fmt: skip
_END = ("stop", "finalize", "ready")
# (previous action, next action; None = stop()) -> what torch_npu does; "!" = it prints a warning
_PLAN: dict[tuple[Any, Any], tuple[str, ...]] = {
    (_N, _W): ("init", "warmup"), (_N, _R): ("init", "start"), (_N, _S): ("init", "start"),
    (_W, _N): ("!Incorrect schedule: WARMUP followed by NONE", "start", "stop", "finalize"),
    (_W, _R): ("start",), (_W, _S): ("start",),
    (_R, _N): ("!Incorrect schedule: RECORD followed by NONE", "stop", "finalize"),
    (_R, _W): ("!Incorrect schedule: RECORD followed by WARMUP", "stop", "finalize"),
    (_S, _N): _END, (_S, _W): (*_END, "init", "warmup"),
    (_S, _R): (*_END, "init", "start"), (_S, _S): (*_END, "init", "start"),
    (_W, None): ("!Incorrect schedule: Stop profiler while current state is WARMUP",
                 "finalize", "delete"),
    (_R, None): ("!Incorrect schedule: Stop profiler while current state is RECORD", *_END),
    (_S, None): ("!Stop profiler while current state is RECORD_AND_SAVE", *_END),
}  # fmt: skip


class profile:  # lower-case, as in torch_npu
    def __init__(
        self,
        *,
        activities: Iterable[ProfilerActivity] | None = None,
        schedule: Callable[[int], ProfilerAction] | None = None,
        on_trace_ready: Callable[..., Any] | None = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        with_flops: bool = False,
        with_modules: bool = False,
        experimental_config: _ExperimentalConfig | None = None,
        execution_trace_observer: Any = None,
        custom_trace_id_callback: Callable[[], str] | None = None,
        use_cuda: bool | None = None,
    ) -> None:
        record("profile", {k: v for k, v in locals().items() if k != "self"})
        # as in torch_npu: no (or an empty) list of activities means every activity
        self.activities = set(activities) if activities else supported_activities()
        self.record_steps = callable(schedule)
        self.schedule: Callable[[int], ProfilerAction] = (
            schedule if callable(schedule) else (lambda step: _R)
        )
        self.on_trace_ready = on_trace_ready
        self.experimental_config = experimental_config
        self.metadata: dict[str, Any] = {}
        self.prof_if = _ProfInterface(self)
        self.step_num = 0
        self.current_action = self.schedule(self.step_num)
        self.stopped = False

    def _transit(self, prev: Any, new: Any) -> None:
        for act in _PLAN.get((prev, new), ()):
            if act.startswith("!"):
                warn(act[1:])
            elif act == "ready":
                if self.on_trace_ready:
                    self.on_trace_ready(self)
            else:
                getattr(self.prof_if, f"{act}_trace" if act != "delete" else "delete_prof_dir")()

    def _marker(self) -> None:
        if self.record_steps:
            record("marker", f"ProfilerStep#{self.step_num}")

    def start(self) -> None:
        record("profile.start")
        self.stopped = False
        if not self.on_trace_ready:
            _state.update(worker_name=None, dir_name=None, export_only=True)
        self._transit(_N, self.current_action)
        self._marker()

    def step(self) -> None:
        record("profile.step")
        if self.stopped:
            warn("Profiler is stopped, step takes no effect!")
            return
        prev = self.current_action
        self.step_num += 1
        self.current_action = self.schedule(self.step_num)
        self._transit(prev, self.current_action)
        self._marker()

    def stop(self) -> None:
        record("profile.stop")
        self._transit(self.current_action, None)
        self.stopped = True

    def add_metadata(self, key: str, value: str) -> None:
        self.metadata[key] = value

    def add_metadata_json(self, key: str, value: str) -> None:
        self.metadata[key] = json.loads(value)

    def __enter__(self) -> profile:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
