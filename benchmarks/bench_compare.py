"""`policy-engine compare` on real 4-rank torchrun jobs (gloo, CPU), as in
tests/test_compare_e2e.py, many times over:

    python benchmarks/bench_compare.py [--pairs 20] [--quick] [--keep DIR]

- a change: the job against the same job with extra matrix multiplications in its
  update_actor region on every rank (``--extra-mm`` of them per step): how many of
  ``--pairs`` pairs say ``slower`` in every window, put the change down to compute, name
  update_actor as the region that grew most and aten::mm among the operators that grew;
- no change: the job against another run of itself: how many pairs say ``no change`` in
  every window;
- cost: ``compare BASE NEW`` against ``analyze BASE`` plus ``analyze NEW`` (best of 3,
  child processes as a user runs them). Target: at most 2x.

Each job records 2 windows of 12 steps per rank. The machine's load average is printed:
the jobs run 4 processes on whatever cores there are.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

from compare_jobs import compare, run_job  # noqa: E402
from job_env import child_env  # noqa: E402

TARGET_COST = 2.0


def _missed(w: dict[str, Any]) -> str | None:
    """Why a window of a changed pair does not say what changed, or None."""
    grown = [o["name"] for o in w["operators"] if o["change_us"] > 0]
    if w["verdict"] != "slower":
        return f"verdict {w['verdict']}: {w['why']}"
    if w["parts"]["compute_us"] != max(w["parts"].values()):
        return f"the change is not mostly compute: {w['parts']}"
    if w["regions"][0]["name"] != "update_actor":
        return f"the region that grew most is {w['regions'][0]['name']}"
    if not {"aten::mm", "aten::matmul"} & set(grown):
        return f"no aten::mm among the operators that grew: {grown}"
    return None


def _found_the_change(result: dict[str, Any]) -> bool:
    why = [m for w in result["windows"] if (m := _missed(w)) is not None]
    for m in why:
        print(f"  missed: {m}")
    return bool(result["windows"]) and not why


def _no_change(result: dict[str, Any]) -> bool:
    wrong = [w for w in result["windows"] if w["verdict"] != "no change"]
    for w in wrong:
        print(f"  not no change: {w['verdict']}: {w['why']}")
    return bool(result["windows"]) and not wrong


def _seconds(*args: str) -> float:
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-m", "policy_engine", *args, "--format", "json"],
                       env=child_env(), capture_output=True, check=True)
        best = min(best, time.perf_counter() - began)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--extra-mm", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="3 pairs of each")
    parser.add_argument("--keep", metavar="DIR",
                        help="run the jobs in DIR and keep them (default: a scratch folder)")
    args = parser.parse_args()
    pairs = 3 if args.quick else args.pairs
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as scratch:
        root = Path(args.keep or scratch)
        began = time.perf_counter()
        plain = [run_job(root / f"plain{i}") for i in range(pairs + 1)]
        changed = [run_job(root / f"mm{i}", extra_mm=args.extra_mm) for i in range(pairs)]
        took = time.perf_counter() - began
        load = os.getloadavg()[0]
        found = sum(_found_the_change(compare(plain[i], changed[i])) for i in range(pairs))
        quiet = [compare(plain[i], plain[i + 1]) for i in range(pairs)]
        calm = sum(_no_change(r) for r in quiet)
        print(f"{2 * pairs + 1} jobs of 4 ranks in {took:.0f} s (load average {load:.1f} on "
              f"{os.cpu_count()} cores)")
        print(f"a change ({args.extra_mm} extra 256x256 matrix multiplications per step in "
              f"update_actor): slower, compute, update_actor and aten::mm in {found} of "
              f"{pairs} pairs")
        print(f"no change (the same job twice): no change in {calm} of {pairs} pairs")
        shown = [w["test"]["p"] for r in quiet for w in r["windows"] if w.get("test")]
        if shown:
            print(f"  (p-values of the no-change windows: least {min(shown):.3g}, median "
                  f"{sorted(shown)[len(shown) // 2]:.3g})")
        cost = _seconds("compare", str(plain[0]), str(changed[0]))
        alone = _seconds("analyze", str(plain[0])) + _seconds("analyze", str(changed[0]))
        print(f"cost: compare {cost:.2f} s, analyze of both runs {alone:.2f} s: "
              f"{cost / alone:.2f}x (target <= {TARGET_COST:.0f}x)")


if __name__ == "__main__":
    main()
