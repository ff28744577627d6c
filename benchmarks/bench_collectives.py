"""Collective calls matched across a large job, from the ranks' summaries alone.

    python benchmarks/bench_collectives.py [--ranks 10000] [--calls 200] [--tp 8]

Each rank's ``collectives`` record (what its summary holds, as JSON would give it back) is
made on the fly: a mesh of tensor-parallel groups of ``--tp`` ranks and data-parallel
groups across them, half of each rank's ``--calls`` calls in each, one rank arriving late
at every call. Timed: reading each record back (collective_form.read, the checks of an
untrusted manifest included) and adding it to the matcher, then the matching itself;
making the records is not timed. Printed: those seconds of CPU time (what one core does;
the wall time beside them, which a loaded machine lengthens, with the load average), and
the process's peak resident memory (VmHWM), which includes the interpreter and the modules.

Targets: <= 10 s and <= 500 MB at 10,000 ranks x 200 calls.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from policy_engine.analysis.collective_form import read  # noqa: E402
from policy_engine.analysis.matching import Matcher  # noqa: E402

TARGET_S, TARGET_MB = 10.0, 500


def record(rank: int, world: int, calls: int, tp: int, late: int) -> dict[str, Any]:
    """Rank ``rank``'s record: calls alternate between its tp and its dp group."""
    rng = random.Random(rank)
    dp = world // tp
    groups = [{"name": f"tp{rank // tp}", "desc": "tp", "size": tp,
               "ranks": [[rank - rank % tp, 1, tp]]},
              {"name": f"dp{rank % tp}", "desc": "dp", "size": dp,
               "ranks": [[rank % tp, tp, dp]]}]
    group, number, start, end, issue = [], [], [], [], []
    for i in range(calls):
        g = i % 2
        t = 1000.0 * i + rng.random() * 5 + (300.0 if rank == late else 0.0)
        group.append(g)
        number.append(i // 2 + 1)
        issue.append(round(t - 20.0, 3))
        start.append(round(t, 3))
        end.append(round(1000.0 * i + 400.0 + rng.random(), 3))
    return {"source": "nccl", "clock": "device", "numbered": "seq", "base_us": 1e12,
            "groups": groups, "names": ["allreduce", "allgather"], "dtypes": ["BFloat16"],
            "calls": {"group": group, "number": number, "name": group, "dtype": [0] * calls,
                      "bytes": [1 << 24] * calls, "issue": issue, "start": start,
                      "end": end},
            "folded": [], "total": calls, "p2p": 0, "capped": False, "problems": []}


def peak_mb() -> float:
    with open("/proc/self/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("VmHWM:"))) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--tp", type=int, default=8)
    args = parser.parse_args()
    late = args.ranks // 3
    matcher = Matcher()
    spent = wall = 0.0
    for rank in range(args.ranks):
        made = record(rank, args.ranks, args.calls, args.tp, late)
        began, clock = time.process_time(), time.perf_counter()
        matcher.add(rank, read(made))
        spent += time.process_time() - began
        wall += time.perf_counter() - clock
    began, clock = time.process_time(), time.perf_counter()
    result = matcher.result(steps=args.calls // 2)
    matched = time.process_time() - began
    wall += time.perf_counter() - clock
    total = spent + matched
    mb = peak_mb()
    print(f"{args.ranks:,} ranks x {args.calls} calls: read and added in {spent:.2f} s, "
          f"matched in {matched:.2f} s, {total:.2f} s of CPU in all (target <= "
          f"{TARGET_S:.0f} s; {wall:.2f} s of wall time at load {os.getloadavg()[0]:.1f}); "
          f"peak memory {mb:.0f} MB (target <= {TARGET_MB} MB)")
    print(f"matched calls: {result['calls']['matched']:,}; late rank: "
          f"{result['late']['rank']} (planted: {late}); groups: {len(result['groups']):,}")
    ok = total <= TARGET_S and mb <= TARGET_MB and result["late"]["rank"] == late
    print("OK" if ok else "MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
