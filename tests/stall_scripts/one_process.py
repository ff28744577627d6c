"""A process alone (world 1) for the stall tests, with ``triggers.stall`` from POLICY.

Usage: one_process.py POLICY MODE

- ``slow``: steps 1-6 of 50 ms, step 3 of SLOW seconds (3 by default): a slow step that
  ends after the stall limit;
- ``hand``: in steps 2 and 3 it waits until the file ``go.<step>`` exists (the test asks
  for records by hand meanwhile), printing ``waiting <step>`` first.

It prints ``done`` at the end.
"""

from __future__ import annotations

import os
import sys
import time

from policy_engine import Topology, apply_policy, load_policy


class Worker:
    def update_actor(self) -> int:
        return 1


def main() -> None:
    policy, mode = sys.argv[1], sys.argv[2]
    worker = Worker()
    prof = apply_policy(worker, "trainer", load_policy(policy), Topology(rank=0, world=1))
    for step in range(1, 7):
        with prof.training_step(step):
            worker.update_actor()
            if mode == "slow" and step == 3:
                time.sleep(float(os.environ.get("SLOW", "3")))
            elif mode == "hand" and step in (2, 3):
                print(f"waiting {step}", flush=True)
                while not os.path.exists(f"go.{step}"):
                    time.sleep(0.05)
            else:
                time.sleep(0.05)
    prof.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
