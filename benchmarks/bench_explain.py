"""`policy-engine explain --world 65536` for a policy of six roles, timed as a user runs it.

    python benchmarks/bench_explain.py [ROLE...]

Every time is also given as a ratio to `python -c "import yaml, attr"` measured in the
same run and environment (the least a command of this package pays), so machines compare.
Targets: a role profiling up to 1,024 ranks explains in <= 1 s (the rollout role, 512 ranks
with the default steps, in JSON, is the row to watch), and one profiling all 65,536 ranks
(reward) in <= 3 s, in JSON as in text. Ranks whose plans differ only in their place are
compiled once, as a group (plan/predict.py); the others are placed without compiling.

Then, in this process, the reward role's JSON is made both ways: by group, as explain does
it, and by compiling and predicting every rank on its own, as explain did before groups;
the ratio of the two is printed, and the outputs must be equal.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
TARGET_ALL_S = 3.0  # every rank of the world profiled
ROOT = Path(__file__).resolve().parent.parent
# Bytecode is cached as an installed package's is, even where PYTHONDONTWRITEBYTECODE is
# set (every run would compile the package again); no policy from the environment.
ENV = {k: v for k, v in os.environ.items()
       if k not in ("PYTHONDONTWRITEBYTECODE", "PROFILE_POLICY_SET", "PROFILE_POLICY")}


def timed(argv: list[str], repeat: int = 3) -> tuple[float, float, int]:
    """Median wall and CPU seconds (user + system) of ``repeat`` runs after one not counted
    (it may write bytecode), and the bytes the last one printed. The CPU time is what the
    target is judged on: on a shared machine, the wall time also counts the others' work."""
    subprocess.run(argv, capture_output=True, check=True, env=ENV, cwd=ROOT)
    walls, cpus, size = [], [], 0
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, check=True, env=ENV, cwd=ROOT)
        walls.append(time.perf_counter() - began)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        size = len(done.stdout)
    return statistics.median(walls), statistics.median(cpus), size


def main() -> int:
    roles = sys.argv[1:] or list(ROLES)
    base_wall, base, _ = timed([sys.executable, "-c", "import yaml, attr"], repeat=7)
    print(f'python -c "import yaml, attr": {base:.3f} s CPU, {base_wall:.3f} s wall (the '
          "units of the ratios below)")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "six_roles.yaml")
        with open(path, "w") as f:
            f.write(POLICY)
        cli = [sys.executable, "-m", "policy_engine"]
        for role in roles:
            profiled = ROLES[role]
            for fmt in ("json", "text"):
                wall, cpu, size = timed([*cli, "explain", path, "--role", role, "--world",
                                         str(WORLD), "--format", fmt])
                target = TARGET_ALL_S if profiled == WORLD else TARGET_S
                mark = "" if (profiled > 1024 and profiled != WORLD) or cpu <= target \
                    else f"  OVER THE {target:g} s TARGET"
                print(f"explain --role {role:8s} ({profiled:5d} profiled ranks) --format "
                      f"{fmt:4s}: {cpu:5.2f} s CPU = {cpu / base:5.1f}x, {wall:5.2f} s wall = "
                      f"{wall / base_wall:5.1f}x import yaml, attr ({size / 1e6:.1f} MB out)"
                      f"{mark}")
        if "reward" in roles:
            grouped_vs_per_rank(path)
    return 0


def grouped_vs_per_rank(path: str, role: str = "reward") -> None:
    """The JSON of every rank of ``role``, by group and rank by rank, timed in process."""
    sys.path.insert(0, str(ROOT))
    from policy_engine import load_policy
    from policy_engine.cli.explain import plan_files
    from policy_engine.plan.compile import compile_plan
    from policy_engine.plan.placement import places
    from policy_engine.plan.predict import entries, rank_entry

    policy = load_policy(path)
    encode = json.JSONEncoder().encode

    def grouped() -> list[str]:
        return [entry.group.json(entry.place) for entry in entries(
            policy, role, world=WORLD, lo=0, hi=20, inner=None, local_world=None,
            files=plan_files) if entry.group is not None]

    def per_rank() -> list[str]:
        return [encode(rank_entry(compile_plan(policy, role, place.topology), 0, 20, None, 1,
                                  plan_files))
                for place in places(policy, role, WORLD) if place.topology is not None]

    began = time.process_time()
    new = grouped()
    new_s = time.process_time() - began
    began = time.process_time()
    old = per_rank()
    old_s = time.process_time() - began
    assert new == old, "the groups' JSON differs from the ranks' own"
    print(f"in process, --role {role} JSON of {len(new)} profiled ranks: by group "
          f"{new_s:.2f} s CPU, rank by rank {old_s:.2f} s CPU: {old_s / new_s:.0f}x faster "
          f"({sum(map(len, new)) / 1e6:.1f} MB)")


if __name__ == "__main__":
    sys.exit(main())
