"""A small training loop for test_nsys_e2e, profiled by the engine and recorded by nsys.

    python nsys_train.py POLICY ROLE STEPS ITERATIONS REPORT_JSON

Each outer step runs ITERATIONS inner steps (one prof.step() each). Every inner step
leaves an NVTX mark "step N iter I" in domain "e2e" so the test can read from a report
which steps it holds. RANK and WORLD_SIZE come from the environment, as under torchrun.
"""

from __future__ import annotations

import json
import os
import sys
import time

import nvtx

from policy_engine import Topology, apply_policy


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Worker:
    def update_actor(self) -> None:
        busy(0.005)

    def compute_log_prob(self) -> None:
        busy(0.003)


def main() -> None:
    policy, role, steps, iterations, report = sys.argv[1:6]
    topology = Topology(rank=int(os.environ["RANK"]), world=int(os.environ["WORLD_SIZE"]))
    worker = Worker()
    prof = apply_policy(worker, role, policy, topology)
    for n in range(int(steps)):
        with prof.training_step(n):
            for i in range(int(iterations)):
                nvtx.mark(f"step {n} iter {i}", domain="e2e")
                worker.update_actor()
                worker.compute_log_prob()
                prof.step()
    prof.close()
    loop_end = time.time()
    # nsys must have written the reports by now, not at exit: linger so that would show.
    time.sleep(2.0)
    partial = f"{report}.partial"  # renamed when complete: the test polls for the file
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(
            {
                "pid": os.getpid(),
                "profiled": type(prof).__name__ == "RoleProfiler",
                "under_nsys": "NSYS_PROFILING_SESSION_ID" in os.environ,
                "loop_end": loop_end,
            },
            f,
        )
    os.replace(partial, report)


if __name__ == "__main__":
    main()
