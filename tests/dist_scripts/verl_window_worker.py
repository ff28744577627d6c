"""One rank of the flagship verl policy (policies/verl_ppo.yaml): the demo's four colocated
workers in one process, placed by RANK/WORLD_SIZE/LOCAL_RANK as verl's Ray workers place
themselves (no process group). Tiny batches: several of these must stay quick on two cores.

Usage: verl_window_worker.py POLICY OUTPUT_DIR STEPS
"""

from __future__ import annotations

import sys

from policy_engine import Topology, load_policy
from policy_engine.cli import ppo


def main() -> None:
    path, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    policy = load_policy(path, overrides=[f"output_dir={out}"])
    ppo.run(policy, steps=steps, batch=4, topology=Topology.discover())


if __name__ == "__main__":
    main()
