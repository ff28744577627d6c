"""One rank of a 2-process torchrun job (gloo) for the store attack tests: it listens with
the policy given (``{rank}`` in it is this rank), trains steps of ``STEP`` seconds until a
file named ``stop`` appears in its working folder, and keeps ``rss<rank>.json`` there
up to date: its resident memory once it listens, and the most seen since.

Usage: store_worker.py POLICY
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch.distributed as dist

from policy_engine import apply_policy, load_policy

STEP = 0.05
_PAGE = os.sysconf("SC_PAGE_SIZE")


class Worker:
    pass


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def main() -> None:
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    policy = load_policy(sys.argv[1].format(rank=rank))
    prof = apply_policy(Worker(), "trainer", policy)
    first = peak = 0
    for step in range(1, 100_000):
        if os.path.exists("stop"):
            break
        with prof.training_step(step):
            time.sleep(STEP)
        if step % 5 == 0:
            now = rss()
            first, peak = first or now, max(peak, now)
            with open(f".rss{rank}", "w") as f:
                json.dump({"step": step, "first": first, "peak": peak}, f)
            os.replace(f".rss{rank}", f"rss{rank}.json")
    prof.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
