"""A stand-in for SGLang's ``Engine`` profiler surface (SGLang 0.5.23).

``start_profile(**kwargs)`` builds a ``ProfileReq`` and runs the request on the engine's
own event loop with ``run_until_complete``, as the real engine does; each scheduler rank
writes ``[{prefix}-]{profile_id}-TP-{tp}[-DP-..][-PP-..][-EP-..][-{STAGE}].trace.json.gz``
when profiling stops, and with ``num_steps`` profiling stops itself after that many
forward passes (a later stop is then refused).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from enum import Enum

from fake_engines._traces import write_trace


class ProfileReqType(Enum):
    START_PROFILE = 1
    STOP_PROFILE = 2


@dataclass(kw_only=True)
class ProfileReq:
    """sglang.srt.managers.io_struct.ProfileReq's fields."""

    req_type: ProfileReqType = ProfileReqType.START_PROFILE
    output_dir: str | None = None
    start_step: int | None = None
    num_steps: int | None = None
    activities: list[str] | None = None
    profile_by_stage: bool = False
    with_stack: bool | None = None
    record_shapes: bool | None = None
    profile_id: str | None = None
    merge_profiles: bool = False
    profile_prefix: str | None = None
    profile_stages: list[str] | None = None
    detailed_annotations: bool = False
    # BaseReq's
    rid: str | None = None
    http_worker_ipc: str | None = None


class Schedulers:
    """The scheduler ranks' profilers (dp x pp x tp, ep = tp when given)."""

    def __init__(self, tp: int, dp: int, pp: int, ep: int) -> None:
        self.tp, self.dp, self.pp, self.ep = tp, dp, pp, ep
        self.req: ProfileReq | None = None
        self.forward = 0
        self.requests: list[ProfileReq] = []

    def start(self, req: ProfileReq) -> None:
        if self.req is not None:
            raise RuntimeError("Profiling is already in progress. Call /stop_profile first.")
        if req.output_dir is None:
            req.output_dir = os.getenv("SGLANG_TORCH_PROFILER_DIR", "/tmp")
        if req.activities is None:
            req.activities = ["CPU", "GPU"]
        req.profile_id = req.profile_id or str(time.time())
        self.requests.append(req)
        self.req, self.forward = req, 0

    def step(self) -> None:
        req = self.req
        if req is None:
            return
        self.forward += 1
        if req.num_steps and self.forward >= req.num_steps:
            self.stop()

    def stop(self) -> None:
        req = self.req
        if req is None:
            raise RuntimeError("Profiling is not in progress. Call /start_profile first.")
        self.req = None
        assert req.output_dir is not None and req.activities is not None
        os.makedirs(req.output_dir, exist_ok=True)
        head = f"{req.profile_prefix}-" if req.profile_prefix else ""
        stages = ["-EXTEND", "-DECODE"] if req.profile_by_stage else [""]
        world = self.tp * self.dp * self.pp
        for dp in range(self.dp):
            for pp in range(self.pp):
                for tp in range(self.tp):
                    parts = [str(req.profile_id), f"TP-{tp}"]
                    if self.dp > 1:
                        parts.append(f"DP-{dp}")
                    if self.pp > 1:
                        parts.append(f"PP-{pp}")
                    if self.ep > 1:
                        parts.append(f"EP-{tp % self.ep}")
                    rank = (dp * self.pp + pp) * self.tp + tp
                    for stage in stages:
                        if {"CPU", "GPU"} & set(req.activities):
                            name = head + "-".join(parts) + stage + ".trace.json.gz"
                            write_trace(os.path.join(req.output_dir, name), rank, world,
                                        "sglang")
                        if "MEM" in req.activities:
                            name = f"{head}{time.time()}-TP-{tp}-memory{stage}.pickle"
                            with open(os.path.join(req.output_dir, name), "wb") as f:
                                f.write(b"\x80\x04N.")  # pickle of None


class Engine:
    """sglang.Engine's profiler methods, on the engine's own event loop."""

    def __init__(self, *, tp_size: int = 1, dp_size: int = 1, pp_size: int = 1,
                 ep_size: int = 1) -> None:
        self.loop = asyncio.new_event_loop()
        self.schedulers = Schedulers(tp_size, dp_size, pp_size, ep_size)

    async def _profile(self, req: ProfileReq) -> None:
        if req.req_type == ProfileReqType.START_PROFILE:
            self.schedulers.start(req)
        else:
            self.schedulers.stop()

    def start_profile(self, **kwargs):  # type: ignore[no-untyped-def]
        req = ProfileReq(req_type=ProfileReqType.START_PROFILE, **kwargs)
        self.loop.run_until_complete(self._profile(req))

    def stop_profile(self):  # type: ignore[no-untyped-def]
        self.loop.run_until_complete(self._profile(ProfileReq(req_type=ProfileReqType.STOP_PROFILE)))

    def generate(self, prompts: list[str]) -> list[str]:
        for _ in prompts:
            self.schedulers.step()
        return [p + " ..." for p in prompts]

    def shutdown(self) -> None:
        self.loop.close()
