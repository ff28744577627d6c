"""One rank of a torchrun job (gloo, CPU) for the collective-matching tests: every inner
step works in the ``work`` region, then all-reduces; the rank named SLOW works FACTOR times
as long, so that the others wait for it at every all-reduce.

Usage: collectives_worker.py POLICY MODE SLOW FACTOR WORK_MS STEPS INNER

MODE ``one``: one all-reduce over the world per inner step. MODE ``two``: a 2x2 mesh, tensor
parallel pairs (0, 1) and (2, 3) all-reduce first, then data parallel pairs (0, 2) and
(1, 3). Work is measured in time, not in operations: however loaded the machine, the slow
rank reaches each all-reduce that much later. Each operation is a 256x256 product (about a
millisecond), so that a fast machine does not fill the slow rank's trace with hundreds of
thousands of tiny ones: its summary must be made within the few seconds a process gets at
exit (runtime/process/summaries.py ``EXIT_WAIT``), or its line says ``cut``.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist

from policy_engine import load_policy, profile_session


def main() -> None:
    policy, mode, slow, factor, work_ms, steps, inner = sys.argv[1:8]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if mode == "two":
        tp = [dist.new_group(r) for r in ([0, 1], [2, 3])][rank // 2]
        dp = [dist.new_group(r) for r in ([0, 2], [1, 3])][rank % 2]
        groups = [tp, dp]
    else:
        groups = [dist.group.WORLD]
    work = float(work_ms) / 1000 * (float(factor) if rank == int(slow) else 1.0)
    prof = profile_session(load_policy(policy), "trainer")
    spare = torch.randn(256, 256) / 16
    grads = [torch.ones(4096 * (i + 1)) for i in range(len(groups))]
    for step in range(1, int(steps) + 1):
        with prof.training_step(step):
            for _ in range(int(inner)):
                with prof.region("work"):
                    until = time.perf_counter() + work
                    while time.perf_counter() < until:
                        spare = torch.tanh(spare @ spare)
                for group, grad in zip(groups, grads, strict=True):
                    dist.all_reduce(grad, group=group)
                prof.step()
    prof.close()
    dist.barrier()
    dist.destroy_process_group()
    assert world == 4, world


if __name__ == "__main__":
    main()
