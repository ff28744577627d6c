"""One rank of a 4-process torchrun job (gloo) for the channel tests: it listens with
every policy given (one role each), starts at a random moment, and trains steps of a few
milliseconds until a file named ``stop`` appears in its working folder.

Usage: channel_worker.py SEED NAPS POLICY... (a POLICY may hold ``{rank}``; NAPS is a JSON
object "rank:step" -> seconds, for a slow step)
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import time

import torch.distributed as dist

from policy_engine import apply_policy, load_policy


class Worker:
    pass


def main() -> None:
    rank = int(os.environ["RANK"])
    seed, naps = int(sys.argv[1]), json.loads(sys.argv[2])
    chance = random.Random(seed * 100 + rank)
    time.sleep(chance.uniform(0, 0.6))  # staggered starts
    dist.init_process_group("gloo")
    profs = []
    for path in sys.argv[3:]:
        policy = load_policy(path.format(rank=rank))
        profs += [apply_policy(Worker(), role, policy) for role in policy.roles]
        time.sleep(chance.uniform(0, 0.3))  # listener threads at random phases
    for step in range(1, 5000):
        if os.path.exists("stop"):
            break
        with contextlib.ExitStack() as steps:
            for prof in profs:
                steps.enter_context(prof.training_step(step))
            time.sleep(naps.get(f"{rank}:{step}", 0.03))
    for prof in profs:
        prof.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
