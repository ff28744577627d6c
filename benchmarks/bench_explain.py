"""`policy-engine explain --world 65536` for a policy of five roles, timed as a user runs it.

    python benchmarks/bench_explain.py

Target: about a second per role (one CLI run), on a 2-core machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

POLICY = """\
version: 1
prefix: big
mesh: {pp: 8, dp: 64, cp: 2, tp: 8, ep: 8}
defaults:
  steps: [2, 3]
  schedule: {warmup: 1, active: 2, repeat: 1}
roles:
  actor: {enabled: true, ranks: {tp: 0, dp: [0, -1]}, regions: [update_actor]}
  critic: {enabled: true, ranks: [0, -1]}
  ref: {enabled: true, ranks: "0-255"}
  rollout: {enabled: true, ranks: {pp: 0, tp: 0, cp: 0}}
  reward: {enabled: true, ranks: all, steps: [5]}
"""
WORLD = 65536
TARGET_S = 1.0


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "five_roles.yaml")
        with open(path, "w") as f:
            f.write(POLICY)
        cli = [sys.executable, "-m", "policy_engine"]
        began = time.perf_counter()
        subprocess.run([*cli, "--help"], check=True, capture_output=True)
        startup = time.perf_counter() - began
        print(f"interpreter + CLI start: {startup:.2f} s")
        for role in ("actor", "critic", "ref", "rollout", "reward"):
            for fmt in ("json", "text"):
                began = time.perf_counter()
                done = subprocess.run([*cli, "explain", path, "--role", role, "--world",
                                       str(WORLD), "--format", fmt], capture_output=True)
                took = time.perf_counter() - began
                assert done.returncode == 0, done.stderr.decode()
                print(f"explain --role {role:8s} --format {fmt:4s}: {took:5.2f} s "
                      f"= {took / TARGET_S:4.2f}x the 1 s target "
                      f"({len(done.stdout) / 1e6:.1f} MB out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
