"""`policy-engine explain --world 65536` for a policy of six roles, timed as a user runs it.

    python benchmarks/bench_explain.py

Every time is also given as a ratio to `python -c "import yaml, attr"` measured in the
same run (the least a command of this package pays), so machines compare. Target: a role
profiling up to 1,024 ranks explains in <= 1 s, and the cost grows linearly with the
ranks that profile (every profiled rank is compiled by the code the runtime runs).
"""

from __future__ import annotations

import os
import statistics
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
  name: "<prefix>_<role>[_step<step>][_c<cycle>]_rank<rank>-of-<world>_<tp><pp><dp><cp><ep>"
roles:
  critic: {enabled: true, ranks: [0, -1]}
  actor: {enabled: true, ranks: {tp: 0, dp: [0, -1]}, regions: [update_actor]}
  rollout: {enabled: true, ranks: {pp: 0, tp: 0, cp: 0}}
  ref: {enabled: true, ranks: "0-1023"}
  reward: {enabled: true, ranks: all, steps: [5]}
"""
ROLES = {"critic": 2, "actor": 256, "rollout": 512, "ref": 1024, "reward": 65536}
WORLD = 65536
TARGET_S = 1.0


def timed(argv: list[str], repeat: int = 3) -> tuple[float, int]:
    """Median seconds of ``repeat`` runs, and the bytes the last one printed."""
    times, size = [], 0
    for _ in range(repeat):
        began = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, check=True)
        times.append(time.perf_counter() - began)
        size = len(done.stdout)
    return statistics.median(times), size


def main() -> int:
    base, _ = timed([sys.executable, "-c", "import yaml, attr"], repeat=7)
    print(f'python -c "import yaml, attr": {base:.3f} s (the unit of the ratios below)')
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "six_roles.yaml")
        with open(path, "w") as f:
            f.write(POLICY)
        cli = [sys.executable, "-m", "policy_engine"]
        for role, profiled in ROLES.items():
            for fmt in ("json", "text"):
                took, size = timed([*cli, "explain", path, "--role", role, "--world",
                                    str(WORLD), "--format", fmt])
                mark = "" if profiled > 1024 or fmt == "text" or took <= TARGET_S else \
                    "  OVER THE 1 s TARGET"
                print(f"explain --role {role:8s} ({profiled:5d} profiled ranks) --format "
                      f"{fmt:4s}: {took:5.2f} s = {took / base:5.1f}x import yaml, attr "
                      f"({size / 1e6:.1f} MB out){mark}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
