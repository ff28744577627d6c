"""A stand-in for vLLM's ``LLM`` and ``AsyncLLM`` profiler surface (vLLM 0.33.0).

Workers are simulated in-process: the engine's parallelism (dp, pp, tp) gives its worker
ranks, and each writes ``{prefix}_dp{dp}_pp{pp}_tp{tp}_dcp0_ep{ep}_rank{r}.{ns}.pt.trace.json.gz``
into ``torch_profiler_dir`` when the profiler stops, as vLLM's workers do through torch's
``tensorboard_trace_handler``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from types import SimpleNamespace
from typing import Any

from fake_engines._traces import write_trace


class ProfilerAlreadyActiveError(RuntimeError):
    """vllm.exceptions.ProfilerAlreadyActiveError (HTTP 409 on the server)."""

    http_status = 409

    def __init__(self) -> None:
        super().__init__("A profiling session is already active. Call /stop_profile before "
                         "starting another session.")


def validate_profile_prefix(prefix: str | None) -> str | None:
    if prefix is None:
        return None
    if not 1 <= len(prefix) <= 128 or not prefix.isascii() or not prefix[0].isalnum() or \
            any(not (c.isalnum() or c in "._-") for c in prefix[1:]):
        raise ValueError("profile_prefix must be 1-128 ASCII characters, start with a letter "
                         "or number, and contain only letters, numbers, '.', '_', or '-'")
    return prefix


class _Workers:
    """What LLM and AsyncLLM share: the workers' profilers."""

    def __init__(self, profiler_config: dict[str, Any] | None, tp: int, pp: int, dp: int,
                 stop_seconds: float) -> None:
        self.config = dict(profiler_config or {})
        self.tp, self.pp, self.dp = tp, pp, dp
        self.stop_seconds = stop_seconds
        # stop() takes stop_seconds unless released sooner; stops_returned counts the
        # stops that have returned (a test can tell that a caller did not wait for one)
        self.released = threading.Event()
        self.stops_returned = 0
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.prefix: str | None = None
        self.active = False
        self.iterations = 0

    def start(self, prefix: str | None, **kwargs: Any) -> None:
        if not self.config.get("profiler"):
            raise RuntimeError("Profiling is not enabled. Please set --profiler-config to "
                               "enable profiling.")
        validate_profile_prefix(prefix)
        self.calls.append(("start", dict(kwargs, profile_prefix=prefix)))
        if self.active:
            return  # the workers ignore a second start
        self.prefix, self.active = prefix, True

    def step(self) -> None:
        if self.active:
            self.iterations += 1

    def stop(self) -> None:
        self.calls.append(("stop", {}))
        if self.stop_seconds:
            self.released.wait(self.stop_seconds)
        try:
            self._stop()
        finally:
            self.stops_returned += 1

    def _stop(self) -> None:
        if not self.active:
            return
        self.active = False
        folder = self.config["torch_profiler_dir"]
        os.makedirs(folder, exist_ok=True)
        gz = self.config.get("torch_profiler_use_gzip", True)
        world = self.tp * self.pp * self.dp
        for dp in range(self.dp):
            for pp in range(self.pp):
                for tp in range(self.tp):
                    rank = (dp * self.pp + pp) * self.tp + tp
                    suffix = f"dp{dp}_pp{pp}_tp{tp}_dcp0_ep{dp * self.tp + tp}_rank{rank}"
                    name = f"{self.prefix}_{suffix}" if self.prefix else suffix
                    file = f"{name}.{time.time_ns()}.pt.trace.json" + (".gz" if gz else "")
                    write_trace(os.path.join(folder, file), rank, world, "vllm", gz=gz)

    def frontend(self, prefix: str | None) -> None:
        name = f"{socket.gethostname()}_{os.getpid()}.async_llm"
        if prefix is not None:
            name = f"{prefix}_{name}"
        path = os.path.join(self.config["torch_profiler_dir"],
                            f"{name}.{time.time_ns()}.pt.trace.json.gz")
        write_trace(path, 0, 1, "async_llm")


def _vllm_config(profiler_config: dict[str, Any] | None) -> SimpleNamespace:
    return SimpleNamespace(profiler_config=SimpleNamespace(**(profiler_config or {})))


class LLM:
    """vllm.LLM's profiler methods."""

    def __init__(self, model: str = "stand-in", *, profiler_config: dict[str, Any] | None = None,
                 tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
                 data_parallel_size: int = 1, stop_seconds: float = 0.0) -> None:
        self.workers = _Workers(profiler_config, tensor_parallel_size, pipeline_parallel_size,
                                data_parallel_size, stop_seconds)
        # where vLLM keeps the launch configuration (LLM.llm_engine.vllm_config)
        self.llm_engine = SimpleNamespace(vllm_config=_vllm_config(profiler_config))

    def start_profile(
        self,
        profile_prefix: str | None = None,
        *,
        delay_iterations: int | None = None,
        max_iterations: int | None = None,
        profiler_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.workers.start(profile_prefix, delay_iterations=delay_iterations,
                           max_iterations=max_iterations, profiler_kwargs=profiler_kwargs)

    def stop_profile(self) -> None:
        self.workers.stop()

    def generate(self, prompts: list[str]) -> list[str]:
        for _ in prompts:
            self.workers.step()
        return [p + " ..." for p in prompts]


class AsyncLLM:
    """vllm.v1.engine.async_llm.AsyncLLM's profiler methods: async, bound to the event loop
    of their first use (its output handler runs there), refusing a second session."""

    def __init__(self, *, profiler_config: dict[str, Any] | None = None,
                 tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
                 data_parallel_size: int = 1, stop_seconds: float = 0.0) -> None:
        self.workers = _Workers(profiler_config, tensor_parallel_size, pipeline_parallel_size,
                                data_parallel_size, stop_seconds)
        self.vllm_config = _vllm_config(profiler_config)  # AsyncLLM.vllm_config
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session = False
        self._lock = threading.Lock()

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("AsyncLLM is attached to a different loop")

    async def start_profile(
        self,
        profile_prefix: str | None = None,
        *,
        delay_iterations: int | None = None,
        max_iterations: int | None = None,
        profiler_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self._bind()
        if self._session:
            raise ProfilerAlreadyActiveError()
        validate_profile_prefix(profile_prefix)
        self._session = True
        self._prefix = profile_prefix
        self.workers.start(profile_prefix, delay_iterations=delay_iterations,
                           max_iterations=max_iterations, profiler_kwargs=profiler_kwargs)

    async def stop_profile(self) -> None:
        self._bind()
        await asyncio.to_thread(self.workers.stop)
        if self._session and not self.workers.config.get("ignore_frontend", False):
            self.workers.frontend(self._prefix)
        self._session = False

    async def generate(self, prompt: str) -> str:
        self._bind()
        self.workers.step()
        await asyncio.sleep(0)
        return prompt + " ..."
