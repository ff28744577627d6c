"""`policy-engine analyze` on generated traces shaped like real ones.

    python benchmarks/bench_analyze.py [--ops 3000] [--steps 3] [--ranks 4096] [--quick]

Traces come from ``tests/analysis_traces.py``: per step, ``--ops`` CPU operators each with
a nested allocation, a kernel launch, its kernel and the flow between them, then an NCCL
all-reduce (GPU-shaped, as a training step's trace is). Printed, in one run:

- throughput: MB of trace (uncompressed JSON) per CPU second with one job, i.e. what one
  core does (and per second of wall time, which a loaded machine lowers);
- scaling: the same traces with 2 jobs against 1;
- peak memory of one worker reading the largest trace (its own RSS, in a child process);
- the seconds ``policy-engine analyze`` takes over ``--ranks`` ranks x 1 window of small
  traces (a child process, as a user runs it);
- the seconds and peak memory of ``policy-engine analyze --format json`` over
  ``--summarised`` ranks x 1 window from their summaries alone (each rank's manifest holds
  the summary of a GPU-shaped trace; no trace on disk).

Targets: >= 40 MB/s per core, >= 1.7x from 1 to 2 jobs, <= 300 MB per worker, <= 10 s at
4,096 ranks; <= 5 s and <= 300 MB at 10,000 summarised ranks. The machine's load is
printed beside the scaling: shared cores measure less.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

from analysis_traces import make_run, make_summarised_run, write_trace  # noqa: E402

from policy_engine.analysis.run import summaries  # noqa: E402

TARGET_MBS, TARGET_SCALE, TARGET_MB, TARGET_S = 40.0, 1.7, 300, 10.0
TARGET_SUMMARISED_S, TARGET_SUMMARISED_MB = 5.0, 300
# The child's own high-water mark (VmHWM, in kB): getrusage's ru_maxrss would carry the
# parent's peak across fork and exec.
_PEAK = """
import sys
from policy_engine.analysis.summary import summarize
def hwm():
    with open("/proc/self/status") as f:
        return next(line.split()[1] for line in f if line.startswith("VmHWM:"))
before = hwm()
summarize(sys.argv[1])
print(before, hwm())
"""
# policy-engine analyze as a user runs it, with the process's own peak memory after it.
_CLI_PEAK = """
import sys
from policy_engine.cli.main import main
code = main(sys.argv[1:])
with open("/proc/self/status") as f:
    print(next(line.split()[1] for line in f if line.startswith("VmHWM:")), file=sys.stderr)
sys.exit(code)
"""


def _spin(_: int) -> int:
    total = 0
    for i in range(5_000_000):
        total += i
    return total


def _ceiling() -> float:
    """How much two processes gain over one on this machine, for work that shares nothing."""
    import concurrent.futures

    began = time.perf_counter()
    for i in range(4):
        _spin(i)
    one = time.perf_counter() - began
    with concurrent.futures.ProcessPoolExecutor(max_workers=2) as pool:
        began = time.perf_counter()
        list(pool.map(_spin, range(4)))
        two = time.perf_counter() - began
    return one / two


def _best(files: list[str], jobs: int, repeat: int) -> tuple[float, float]:
    """The best wall time of ``repeat`` runs, and the CPU time of this process in it (all
    of the work when ``jobs`` is 1: on a shared machine, MB per CPU second is what one
    core does)."""
    best, cpu = float("inf"), 0.0
    for _ in range(repeat):
        began, used = time.perf_counter(), time.process_time()
        summaries(files, jobs)
        took = time.perf_counter() - began
        if took < best:
            best, cpu = took, time.process_time() - used
    return best, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=3000, help="operators per step")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--summarised", type=int, default=10_000,
                        help="ranks of the run analysed from summaries alone")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one repeat")
    args = parser.parse_args()
    ops, ranks, repeat = (500, 256, 1) if args.quick else (args.ops, args.ranks, 2)
    summarised = 1000 if args.quick else args.summarised
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    with tempfile.TemporaryDirectory(prefix="bench-analyze-") as root:
        files = []
        for rank in range(4):
            path = os.path.join(root, "big", f"rank{rank}.pt.trace.json")
            write_trace(path, rank, 4, steps=args.steps, ops=ops, gpu=True, slow=1,
                        extra_us=2000.0)
            files.append(path)
        mb = sum(os.path.getsize(f) for f in files) / 1e6
        print(f"traces: 4 x {mb / 4:.1f} MB (GPU-shaped, {ops} operators and kernels per "
              f"step, {args.steps} steps)")
        load = os.getloadavg()[0]
        one, cpu = _best(files, 1, repeat)
        per_core = mb / cpu
        print(f"throughput, 1 job: {per_core:.1f} MB per CPU second "
              f"(target >= {TARGET_MBS:.0f}: {per_core / TARGET_MBS:.2f}x the target); "
              f"{mb / one:.1f} MB/s of wall time at load average {load:.1f}")
        used = time.process_time()
        with open(files[0], encoding="utf-8") as f:
            json.load(f)
        ceiling = os.path.getsize(files[0]) / 1e6 / (time.process_time() - used)
        print(f"  (json.load of one of these files, all in memory at once: {ceiling:.1f} MB per "
              "CPU second on this machine)")
        two, _ = _best(files, 2, repeat)
        load = os.getloadavg()[0]
        print(f"scaling 1 -> 2 jobs: {one / two:.2f}x (target >= {TARGET_SCALE}; "
              f"load average {load:.1f} on {os.cpu_count()} cores while measured)")
        print(f"  (the same machine's own ceiling, a pure-Python loop in 1 -> 2 processes: "
              f"{_ceiling():.2f}x)")
        big = os.path.join(root, "big", "long.pt.trace.json")
        write_trace(big, 0, 4, steps=4 * args.steps, ops=ops, gpu=True, slow=1, extra_us=2000.0)
        peak = subprocess.run([sys.executable, "-c", _PEAK, big], env=env, check=True,
                              capture_output=True, text=True).stdout.split()
        start_mb, peak_mb = int(peak[0]) / 1024, int(peak[1]) / 1024
        print(f"peak memory of a worker reading {os.path.getsize(big) / 1e6:.1f} MB: "
              f"{peak_mb:.0f} MB, of which {start_mb:.0f} MB is the interpreter with its "
              f"imports (target <= {TARGET_MB})")
        small = os.path.join(root, "ranks")
        began = time.perf_counter()
        make_run(small, ranks, ops=10, steps=2)
        made = time.perf_counter() - began
        began = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "policy_engine", "analyze", small,
                               "--format", "json"], env=env, capture_output=True, text=True)
        took = time.perf_counter() - began
        assert done.returncode == 0, done.stderr[-2000:]
        print(f"{ranks} ranks x 1 window of small traces: {took:.1f} s with the default "
              f"jobs (target <= {TARGET_S:.0f} s: {TARGET_S / took:.2f}x headroom; "
              f"the run took {made:.0f} s to generate)")
        only = os.path.join(root, "summarised")
        make_summarised_run(only, summarised, steps=3, ops=200, gpu=True, extra_us=2000.0)
        size = sum(e.stat().st_size for e in os.scandir(os.path.join(only, "manifests")))
        env_compiled = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
        began = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", _CLI_PEAK, "analyze", only, "--format",
                               "json"], env=env_compiled, capture_output=True, text=True)
        took = time.perf_counter() - began
        assert done.returncode == 0, done.stderr[-2000:]
        peak_mb = int(done.stderr.split()[-1]) / 1024
        windows = json.loads(done.stdout)["windows"]
        assert len(windows) == 1 and len(windows[0]["ranks"]) == summarised
        print(f"{summarised} ranks x 1 window from summaries alone ({size / 1e6:.0f} MB of "
              f"manifests, no trace): {took:.1f} s, {peak_mb:.0f} MB peak (targets <= "
              f"{TARGET_SUMMARISED_S:.0f} s, <= {TARGET_SUMMARISED_MB} MB: "
              f"{TARGET_SUMMARISED_S / took:.2f}x and {TARGET_SUMMARISED_MB / peak_mb:.2f}x "
              "headroom)")


if __name__ == "__main__":
    main()
