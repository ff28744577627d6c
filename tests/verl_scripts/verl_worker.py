"""One rank of a verl-shaped job: the hybrid actor+ref worker verl's engine workers are,
built from verl's own DistProfiler, DistProfilerExtension and @DistProfiler.annotate, with
an inner TrainingWorker-like profiler whose update loop steps once per mini-batch inside
record_function("mini_batch<i>"), and a trainer loop that calls start_profile /
stop_profile at the profiled steps as verl's RayPPOTrainer does. The same code runs with
verl's own profiler and, with PROFILE_POLICY set, through the plugin.

Usage: verl_worker.py CONFIG_JSON   (run under torchrun, gloo)

CONFIG_JSON: {"save_path", "steps" (verl's global_profiler.steps), "total_steps",
"mini_batches", "all_ranks" | "ranks", "discrete", "schedule" (or null), "fail" (a stage
label that raises at the last profiled step, or null), "finish_hook_cmd", "tool"}; or, in
place of the profiler keys, "profiler" and "ref_profiler": the actor's and the ref's
profiler blocks of a composed verl config (resolved), read as verl's workers read them.

Each rank writes report<rank>.json to "report_dir": its outcome, stage calls, and
"outputs": [step, path] for each file or folder under the save path whose name carries this
process's pid, by the step during which it appeared (verl's npu captures name no step).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import verl  # noqa: F401  (loads the verl.plugins entry points, as every verl process does)
from verl.utils.profiler import DistProfiler, DistProfilerExtension, ProfilerConfig
from verl.utils.profiler.config import (
    NPUToolConfig,
    TorchProfilerScheduleConfig,
    TorchProfilerToolConfig,
)


class StageFailed(RuntimeError):
    """The failure a test plants inside a stage."""


def profiler_config(cfg: dict) -> tuple[ProfilerConfig, Any]:
    """verl's per-role profiler block, as ActorRolloutRefWorker reads it from Hydra."""
    name = cfg.get("tool", "torch")
    schedule = cfg.get("schedule")
    if name == "npu":
        tool: Any = NPUToolConfig(contents=["cpu"], discrete=cfg.get("discrete", False))
    else:
        tool = TorchProfilerToolConfig(
            contents=["cpu"], discrete=cfg.get("discrete", False),
            schedule=TorchProfilerScheduleConfig(**schedule) if schedule else None)
    config = ProfilerConfig(
        tool=name, enable=True, all_ranks=cfg.get("all_ranks", False),
        ranks=cfg.get("ranks", []), save_path=cfg["save_path"], tool_config={name: tool},
        finish_hook_cmd=cfg.get("finish_hook_cmd"))
    return config, tool


def block_config(block: dict | None) -> tuple[ProfilerConfig, Any]:
    """A role's profiler block of a composed verl config, read as verl's
    ActorRolloutRefWorker reads it (engine_workers.py)."""
    from omegaconf import OmegaConf
    from verl.utils import omega_conf_to_dataclass

    omega = OmegaConf.create(block or {})
    config = omega_conf_to_dataclass(omega, dataclass_type=ProfilerConfig)
    name = omega.get("tool")
    tool = (omega_conf_to_dataclass(omega.tool_config.get(name))
            if name in ("npu", "nsys", "torch", "torch_memory", "precision_debugger") else None)
    return config, tool


def own_outputs(save_path: str | None) -> set[str]:
    """What this process wrote under ``save_path``: the entries whose names carry its pid
    (verl's torch traces ``..._pid<P>_...``, torch_npu's ``<host>_<P>_..._ascend_pt``)."""
    if not save_path or not os.path.isdir(save_path):
        return set()
    mark = re.compile(rf"(?:^|_|pid){os.getpid()}_")
    root = Path(save_path)
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if mark.search(p.name)}


class TrainingWorker(DistProfilerExtension):
    """verl's TrainingWorker, reduced: a model and an update loop of mini-batches."""

    def __init__(self, rank: int, config: ProfilerConfig, tool: Any,
                 fail: dict) -> None:
        DistProfilerExtension.__init__(self, DistProfiler(
            rank=rank, config=config, tool_config=tool, save_file_prefix="language_model"))
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                         torch.nn.Linear(32, 1))
        self.optim = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.fail = fail

    @DistProfiler.annotate(color="red", role="train_batch")
    def train_batch(self, batch: torch.Tensor) -> float:
        loss = self.model(batch).pow(2).mean()
        self.optim.zero_grad()
        loss.backward()
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
        self.optim.step()
        return float(loss)

    def train_mini_batch(self, data: torch.Tensor, mini_batches: int) -> list[float]:
        losses = []
        for i, batch in enumerate(data.chunk(mini_batches)):
            with torch.profiler.record_function(f"mini_batch{i}"):
                losses.append(self.train_batch(batch))
            self.profiler.step()
        return losses


class ActorRolloutRefWorker(DistProfilerExtension):
    """verl's hybrid worker, reduced: its three training stages."""

    def __init__(self, rank: int, cfg: dict) -> None:
        composed = "profiler" in cfg
        config, tool = block_config(cfg["profiler"]) if composed else profiler_config(cfg)
        DistProfilerExtension.__init__(self, DistProfiler(
            rank=rank, config=config, tool_config=tool, save_file_prefix="actor_rollout_ref"))
        self.save_path = config.save_path
        self.fail: dict = {"stage": cfg.get("fail"), "now": False}
        self.calls: dict[str, int] = {}
        # init_model: the inner workers are built after the outer profiler, the ref's (from
        # the ref's own block) before the actor's, as in verl.
        if composed:
            ref_config, ref_tool = block_config(cfg.get("ref_profiler"))
            self.ref_profiler = DistProfiler(rank=rank, config=ref_config, tool_config=ref_tool,
                                             save_file_prefix="language_model")
        self.actor = TrainingWorker(rank, config, tool, self.fail)
        self.ref_model = torch.nn.Linear(16, 1)
        self.mini_batches = cfg.get("mini_batches", 4)

    def _ran(self, stage: str) -> None:
        self.calls[stage] = self.calls.get(stage, 0) + 1
        if self.fail["now"] and self.fail["stage"] == stage:
            raise StageFailed(f"planted failure in {stage}")

    @DistProfiler.annotate(color="olive", role="ref_compute_log_prob")
    def compute_ref_log_prob(self, data: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            out = self.ref_model(data)
        self._ran("ref_compute_log_prob")
        return out

    @DistProfiler.annotate(color="blue", role="actor_compute_log_prob")
    def compute_log_prob(self, data: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            out = self.actor.model(data)
        self._ran("actor_compute_log_prob")
        return out

    @DistProfiler.annotate(color="red", role="actor_update", scheduled=True)
    def update_actor(self, data: torch.Tensor) -> list[float]:
        self._ran("actor_update")
        return self.actor.train_mini_batch(data, self.mini_batches)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    worker = ActorRolloutRefWorker(rank, cfg)
    steps = sorted(cfg["steps"])
    outcome = "ok"
    seen: set[str] = set()
    outputs: list[tuple[int, str]] = []
    for step in range(1, cfg["total_steps"] + 1):
        profiled = step in steps
        worker.fail["now"] = profiled and step == steps[-1]
        seed = torch.Generator().manual_seed(step)
        data = torch.randn(8 * worker.mini_batches, 16, generator=seed)
        if profiled:
            worker.start_profile(role="train", profile_step=step)
        try:
            worker.compute_log_prob(data)
            worker.compute_ref_log_prob(data)
            worker.update_actor(data)
        except StageFailed as err:
            outcome = f"raised: {err}"
            break  # the trainer dies here: stop_profile is never called
        if profiled:
            worker.stop_profile(run_command=step == steps[-1])
        new = own_outputs(worker.save_path) - seen
        outputs += [(step, path) for path in sorted(new)]
        seen |= new
    dist.barrier()
    report = {"rank": rank, "outcome": outcome, "calls": worker.calls, "outputs": outputs}
    with open(os.path.join(cfg["report_dir"], f"report{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
