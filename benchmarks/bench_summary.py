"""What summarising a large trace costs the training loop that recorded it.

    python benchmarks/bench_summary.py [--mb 100] [--rounds 5] [--quick]

A training-like loop runs on the main thread (pure-Python work and small torch operators,
steps of about 30 ms). Its mean step time is measured, in one run:

(a) with nothing else running;
(b) while a GPU-shaped trace of ``--mb`` MB (uncompressed JSON, gzipped on disk, from
    ``tests/analysis_traces.py``) is summarised the way the runtime does it after a
    capture: ``runtime.process.summaries`` hands it to a worker process at the lowest priority,
    and one of its threads waits for the worker without holding the GIL;
(c) for contrast, while the same ``summarize()`` runs on a thread of this process, where
    it holds the GIL against the loop.

Printed: the ratios (b)/(a) (target <= 1.05) and (c)/(a), each the median of the rounds'
own ratios, (a) being measured in each round before and after its (b) or (c). On a 2-core
machine the worker of (b) runs on the other core; where other processes keep every core
busy, its nice value leaves them the cores first (the worker then takes longer: its
seconds are printed, as is the machine's load). Two cores still share caches and memory:
any process busy on the other core, the summary's or another, costs the loop a few
percent there.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

import torch  # noqa: E402
from analysis_traces import write_trace  # noqa: E402

from policy_engine.analysis import summarize  # noqa: E402
from policy_engine.files.records import trace_line  # noqa: E402
from policy_engine.runtime.process import summaries  # noqa: E402

TARGET = 1.05
#: Operators per MB of the generated trace's JSON (each with its allocation, kernel
#: launch, kernel and flow: about 1.3 KB).
OPS_PER_MB = 750


class Loop:
    """A training-like step: Python bookkeeping and small tensor operators."""

    def __init__(self) -> None:
        torch.set_num_threads(1)  # one core for the loop, as a rank's main thread has
        self.model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                         torch.nn.Linear(128, 128))
        self.data = torch.randn(32, 128)
        self.work = 20_000

    def step(self) -> None:
        stats: dict[int, float] = {}
        for i in range(self.work):  # a data pipeline's and a logger's Python work
            stats[i % 97] = stats.get(i % 97, 0.0) + i * 0.5
        for _ in range(10):
            self.model(self.data).sum().backward()

    def calibrate(self, target: float = 0.03) -> float:
        for _ in range(3):  # the Python part scales; the torch part is what it is
            took = self.time(5)
            self.work = max(1000, int(self.work * (1 + (target - took) / took * 1.5)))
        return self.time(10)

    def time(self, steps: int) -> float:
        began = time.perf_counter()
        for _ in range(steps):
            self.step()
        return (time.perf_counter() - began) / steps

    def while_running(self, busy: Callable[[], bool], least: int = 10,
                      most: float = 60.0) -> list[float]:
        """Step times while ``busy()`` holds (at least ``least`` steps, at most ``most``
        seconds: a worker that other processes leave no core to is not waited for)."""
        times: list[float] = []
        start = time.perf_counter()
        while (busy() and time.perf_counter() - start < most) or len(times) < least:
            began = time.perf_counter()
            self.step()
            times.append(time.perf_counter() - began)
        return times


def make_trace(folder: str, mb: float) -> tuple[str, int]:
    path = os.path.join(folder, "bench.pt.trace.json.gz")
    steps = 20
    ops = max(10, int(mb * OPS_PER_MB / steps))
    size = write_trace(path, 0, 8, steps=steps, ops=ops, gpu=True)
    return path, size


def in_worker(folder: str, path: str, size: int) -> Callable[[], bool]:
    """Hand the trace to the runtime's summary path; whether it is still running."""
    line = trace_line({"role": "bench", "rank": 0}, capture="1-1", status="complete",
                      path=os.path.relpath(path, folder), bytes=size)
    summaries.order(folder, line, path, keep="traces", budget=None)
    pool = summaries.pool()

    def busy() -> bool:
        with pool.cond:
            return bool(pool.waiting or pool.running)
    return busy


def in_thread(path: str) -> Callable[[], bool]:
    thread = threading.Thread(target=summarize, args=(path,), daemon=True)
    thread.start()
    return thread.is_alive


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0,
                        help="the trace's size as uncompressed JSON")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="--mb 25 --rounds 3")
    args = parser.parse_args()
    if args.quick:
        args.mb, args.rounds = 25.0, 3
    loop = Loop()
    print(f"step: {loop.calibrate() * 1e3:.1f} ms (pure Python and 10 small torch "
          f"forward+backward passes, one thread); {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f} (other processes on the cores skew every figure)")
    with tempfile.TemporaryDirectory() as folder:
        began = time.perf_counter()
        path, size = make_trace(folder, args.mb)
        took = time.perf_counter() - began
        began = time.perf_counter()
        summarize(path)
        alone = time.perf_counter() - began
        print(f"trace: {size / 1e6:.1f} MB gzipped, about {args.mb:.0f} MB of JSON, made in "
              f"{took:.1f} s; summarize() alone: {alone:.2f} s")
        spent: list[float] = []  # how long each worker ran, as the loop saw it
        worst = max(30.0, 20 * alone)
        half = max(40, int(alone / 0.03)) // 2
        loop.while_running(in_worker(folder, path, size), most=worst)  # warm-up: unmeasured
        summaries.wait()
        # Each (b) and each (c) has its own (a), measured on both sides of it, so that a
        # drift of the machine hits the baseline as it hits them; every (c) comes after
        # every (b): the summaries made in this process leave its heap larger.
        pairs: dict[str, list[tuple[float, float]]] = {"worker": [], "thread": []}
        steps = {"alone": 0, "worker": 0, "thread": 0}
        for kind in ("worker", "thread"):
            for _ in range(args.rounds):
                base = loop.while_running(lambda: False, least=half)
                began = time.perf_counter()
                busy = in_worker(folder, path, size) if kind == "worker" else in_thread(path)
                during = loop.while_running(busy, most=worst)
                if kind == "worker":
                    spent.append(time.perf_counter() - began)
                base += loop.while_running(lambda: False, least=half)
                summaries.wait()
                pairs[kind].append((statistics.mean(base), statistics.mean(during)))
                steps["alone"] += len(base)
                steps[kind] += len(during)
    a = statistics.median(x for found in pairs.values() for x, _ in found)
    b, c = (statistics.median(y for _, y in pairs[kind]) for kind in ("worker", "thread"))
    ratio_b, ratio_c = (statistics.median(y / x for x, y in pairs[kind])
                        for kind in ("worker", "thread"))
    print(f"(a) alone:                       {a * 1e3:6.2f} ms/step ({steps['alone']} steps)")
    print(f"(b) summary in a worker process: {b * 1e3:6.2f} ms/step ({steps['worker']} steps; "
          f"the worker took {' '.join(f'{x:.2f}' for x in spent)} s)")
    print(f"(c) summary on a thread here:    {c * 1e3:6.2f} ms/step ({steps['thread']} steps)")
    print("per round, (b)/(a): " + " ".join(f"{y / x:.3f}" for x, y in pairs["worker"]) +
          "; (c)/(a): " + " ".join(f"{y / x:.3f}" for x, y in pairs["thread"]))
    print(f"load average now {os.getloadavg()[0]:.2f}")
    ok = ratio_b <= TARGET
    print(f"(b)/(a) = {ratio_b:.3f} (median of the rounds; target <= {TARGET}: "
          f"{'met' if ok else 'NOT met'}); (c)/(a) = {ratio_c:.3f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
