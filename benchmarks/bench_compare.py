"""`policy-engine compare` on real 4-rank torchrun jobs (gloo, CPU), as in
tests/test_compare_e2e.py, many times over:

    python benchmarks/bench_compare.py [--changed 10] [--same 20] [--steps 8]
                                       [--extra-mm 14] [--quick] [--keep DIR]

- a change: the job against the same job with extra matrix multiplications in its
  update_actor region on every rank (``--extra-mm`` 256x256 products per step, about 60%
  more time per step on a loaded 2-core machine): of ``--changed`` pairs, how many say
  ``slower`` in every window, how many say ``slower`` or ``inconclusive`` in every window
  (never ``no change``: the target), and whether the slower windows put the change down
  to compute, update_actor and aten::mm;
- no change: the job against another run of itself, ``--same`` pairs: how many never say
  ``slower`` or ``faster`` (the target), and how the windows split between ``no change``
  and ``inconclusive``;
- cost: ``compare BASE NEW`` against ``analyze BASE`` plus ``analyze NEW`` (best of 3,
  child processes as a user runs them). Target: at most 2x.

Each job records 2 windows of ``--steps`` steps per rank (the first of each is left out of
the test). The machine's load average is printed: the jobs run 4 processes on whatever
cores there are.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

from compare_jobs import FEW_STEPS, SOME_MM, compare, run_job  # noqa: E402
from job_env import child_env  # noqa: E402

TARGET_COST = 2.0


def _missed(w: dict[str, Any]) -> str | None:
    """Why a slower window of a changed pair does not say what changed, or None."""
    grown = [o["name"] for o in w["operators"] if o["change_us"] > 0]
    if w["parts"]["compute_us"] != max(w["parts"].values()):
        return f"the change is not mostly compute: {w['parts']}"
    if w["regions"][0]["name"] != "update_actor":
        return f"the region that grew most is {w['regions'][0]['name']}"
    if not {"aten::mm", "aten::matmul"} & set(grown):
        return f"no aten::mm among the operators that grew: {grown}"
    return None


def _seconds(*args: str) -> float:
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-m", "policy_engine", *args, "--format", "json"],
                       env=child_env(), capture_output=True, check=True)
        best = min(best, time.perf_counter() - began)
    return best


def _changed(results: list[dict[str, Any]]) -> None:
    windows = [w for r in results for w in r["windows"]]
    slower = sum(all(w["verdict"] == "slower" for w in r["windows"]) for r in results)
    honest = sum(all(w["verdict"] in ("slower", "inconclusive") for w in r["windows"])
                 for r in results)
    named = [m for w in windows if w["verdict"] == "slower" and (m := _missed(w))]
    for w in windows:
        if w["verdict"] != "slower":
            print(f"  {w['verdict']}: {w['why']}")
    for m in named:
        print(f"  slower, but {m}")
    changes = [w["test"]["change"] for w in windows if w["test"]["change"] is not None]
    print(f"  windows: {dict(Counter(w['verdict'] for w in windows))}; median step change "
          f"{statistics.median(changes):+.0%} (least {min(changes):+.0%})")
    print(f"  pairs slower in every window: {slower} of {len(results)}; slower or "
          f"inconclusive in every window, never no change: {honest} of {len(results)} "
          f"(target: all); slower windows that name compute, update_actor and aten::mm: "
          f"{sum(w['verdict'] == 'slower' for w in windows) - len(named)} of "
          f"{sum(w['verdict'] == 'slower' for w in windows)}")


def _same(results: list[dict[str, Any]]) -> None:
    windows = [w for r in results for w in r["windows"]]
    calm = sum(all(w["verdict"] not in ("slower", "faster") for w in r["windows"])
               for r in results)
    for w in windows:
        if w["verdict"] in ("slower", "faster"):
            print(f"  {w['verdict']}: {w['why']}")
    print(f"  windows: {dict(Counter(w['verdict'] for w in windows))}")
    print(f"  pairs never slower or faster: {calm} of {len(results)} (target: all)")
    shown = sorted(w["test"]["p"] for w in windows if w["test"]["p"] is not None)
    decide = sorted(w["test"]["decide_steps"] for w in windows if w["test"]["decide_steps"])
    seen = sorted(w["test"]["detectable"] for w in windows
                  if w["test"]["detectable"] is not None)
    if shown:
        print(f"  p: least {shown[0]:.3g}, median {statistics.median(shown):.3g}")
    if seen:
        print(f"  least change the steps could call: median {statistics.median(seen):.0%}")
    undecidable = sum(1 for w in windows if w["verdict"] == "inconclusive"
                      and w["test"]["decide_steps"] is None)
    if decide:
        print(f"  steps a side that would decide: median {statistics.median(decide):.0f} "
              f"({len(decide)} windows; {undecidable} where no count would)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changed", type=int, default=10, help="pairs with the change")
    parser.add_argument("--same", type=int, default=20, help="pairs of the same job")
    parser.add_argument("--steps", type=int, default=FEW_STEPS, help="steps per window")
    parser.add_argument("--extra-mm", type=int, default=SOME_MM)
    parser.add_argument("--quick", action="store_true", help="3 pairs of each")
    parser.add_argument("--keep", metavar="DIR",
                        help="run the jobs in DIR and keep them (default: a scratch folder)")
    args = parser.parse_args()
    changed, same = (3, 3) if args.quick else (args.changed, args.same)
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as scratch:
        root = Path(args.keep or scratch)
        began = time.perf_counter()
        plain, extra = [], []
        # each changed job beside the plain one it is compared with, under the same load
        for i in range(max(changed, same + 1)):
            plain.append(run_job(root / f"plain{i}", inner=args.steps))
            if i < changed:
                extra.append(run_job(root / f"mm{i}", inner=args.steps,
                                     extra_mm=args.extra_mm))
        took = time.perf_counter() - began
        load = os.getloadavg()[0]
        print(f"{len(plain) + len(extra)} jobs of 4 ranks, {args.steps} steps a window, in "
              f"{took:.0f} s (load average {load:.1f} on {os.cpu_count()} cores)")
        print(f"a change ({args.extra_mm} extra 256x256 matrix multiplications per step in "
              f"update_actor), {changed} pairs:")
        _changed([compare(plain[i], extra[i]) for i in range(changed)])
        print(f"the same job twice, {same} pairs:")
        _same([compare(plain[i], plain[i + 1]) for i in range(same)])
        cost = _seconds("compare", str(plain[0]), str(extra[0]))
        alone = _seconds("analyze", str(plain[0])) + _seconds("analyze", str(extra[0]))
        print(f"cost: compare {cost:.2f} s, analyze of both runs {alone:.2f} s: "
              f"{cost / alone:.2f}x (target <= {TARGET_COST:.0f}x)")


if __name__ == "__main__":
    main()
