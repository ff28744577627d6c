"""One rank of a verl-shaped hybrid job: verl's hybrid engine, the actor, its rollout and
its ref in one worker process, built from verl's own DistProfiler, DistProfilerExtension
and @DistProfiler.annotate, and a trainer loop that calls start_profile / stop_profile at
the profiled steps as verl's RayPPOTrainer does. With PROFILE_POLICY set, the plugin
(reached through `import verl`) drives it.

Each training step runs the stages in sequence, each for a time of its own (measured in
time, not in operations, so that the shares hold on a loaded machine): generate (GEN_MS),
the actor's and the ref's log-probs (LOGP_MS each), the actor's update (UPD_MS, ending in
an all-reduce of its gradients).

Usage: hybrid_step_worker.py STEPS PROFILED   (under torchrun, gloo; PROFILED: "3,4")
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
import verl  # noqa: F401  (loads the verl.plugins entry points, as every verl process does)
from verl.utils.profiler import DistProfiler, DistProfilerExtension, ProfilerConfig
from verl.utils.profiler.config import TorchProfilerToolConfig

GEN_MS, LOGP_MS, UPD_MS = 400, 100, 200


def busy(ms: float) -> None:
    spare = torch.randn(64, 64)
    until = time.perf_counter() + ms / 1000
    while time.perf_counter() < until:
        spare = torch.tanh(spare @ spare)


class ActorRolloutRefWorker(DistProfilerExtension):
    """verl's hybrid worker, reduced to its stages."""

    def __init__(self, rank: int, profiled: list[int]) -> None:
        tool = TorchProfilerToolConfig(contents=["cpu"], discrete=False)
        config = ProfilerConfig(tool="torch", enable=True, all_ranks=True, ranks=[],
                                save_path="verl_save", tool_config={"torch": tool})
        DistProfilerExtension.__init__(self, DistProfiler(
            rank=rank, config=config, tool_config=tool, save_file_prefix="actor_rollout_ref"))
        self.grad = torch.ones(256)

    @DistProfiler.annotate(color="green", role="generate_sequences")
    def generate_sequences(self) -> None:
        busy(GEN_MS)

    @DistProfiler.annotate(color="blue", role="actor_compute_log_prob")
    def compute_log_prob(self) -> None:
        busy(LOGP_MS)

    @DistProfiler.annotate(color="olive", role="ref_compute_log_prob")
    def compute_ref_log_prob(self) -> None:
        busy(LOGP_MS)

    @DistProfiler.annotate(color="red", role="actor_update")
    def update_actor(self) -> None:
        busy(UPD_MS)
        dist.all_reduce(self.grad)


def main() -> None:
    steps, profiled = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
    dist.init_process_group("gloo")
    worker = ActorRolloutRefWorker(dist.get_rank(), profiled)
    for step in range(1, steps + 1):
        if step in profiled:
            worker.start_profile(role="train", profile_step=step)
        worker.generate_sequences()
        worker.compute_log_prob()
        worker.compute_ref_log_prob()
        worker.update_actor()
        if step in profiled:
            worker.stop_profile()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
