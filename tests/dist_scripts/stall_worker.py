"""One rank of a torchrun job (gloo, CPU) for the stall tests: every training step computes
in its ``update_actor`` region, then all-reduces. In step STALL_STEP the rank named STUCK
stops before the all-reduce, so the others block in it:

- ``sleep``: it sleeps for SECONDS (a hang, when longer than the test waits);
- ``stop``: it stops itself with SIGSTOP (it answers nothing from then on);

Usage: stall_worker.py POLICY STEPS STALL_STEP STUCK MODE SECONDS

Each rank writes its pid to ``pid.<rank>`` (for the test to end it), waits WARMUP seconds
(3; a job runs a while before it hangs: its listener threads have joined the job's
channel), prints ``step N`` as it ends a step, and ``done`` at the end.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from policy_engine import apply_policy, load_policy


class Worker:
    def __init__(self) -> None:
        self.data = torch.randn(64, 64)

    def update_actor(self) -> torch.Tensor:
        return torch.tanh(self.data @ self.data)


def main() -> None:
    policy, steps, stall_step, stuck, mode, seconds = sys.argv[1], int(sys.argv[2]), \
        int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], float(sys.argv[6])
    # torch.profiler's first start imports torch._dynamo: seconds on a loaded machine,
    # which would pass a stall limit of its own; imported here, before any step
    import torch._dynamo

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with open(f"pid.{rank}", "w") as f:
        f.write(str(os.getpid()))
    worker = Worker()
    prof = apply_policy(worker, "trainer", load_policy(policy))
    time.sleep(float(os.environ.get("WARMUP", "3")))
    grad = torch.ones(16)
    for step in range(1, steps + 1):
        with prof.training_step(step):
            worker.update_actor()
            if step == stall_step and rank == stuck:
                if mode == "stop":
                    os.kill(os.getpid(), signal.SIGSTOP)
                else:
                    time.sleep(seconds)  # the stuck rank: the others wait for it
            dist.all_reduce(grad)
            prof.step()
        print(f"step {step}", flush=True)
    prof.close()
    dist.destroy_process_group()
    print("done", flush=True)


if __name__ == "__main__":
    main()
