"""What a rank's summary worker holds: its peak memory and time on a 1 GB trace.

    python benchmarks/bench_summary_memory.py [--mb 1000] [--steps N] [--ops 600]

A GPU-shaped trace of ``--mb`` MB of JSON (gzipped on disk, written as a stream by
``tests/analysis_traces.py`` ``stream_trace``: steps of ``--ops`` operators, each with its
kernel launch and a kernel apart from the others, so that none merge; about 5.8 million
events and 1.95 million kernels a gigabyte) is summarised by the worker the runtime starts
after a capture (``python -m policy_engine.analysis.summarize_main``, with the runtime's
limits: its data segment held to ``MEMORY_BYTES``, its line to ``MAX_KEPT_BYTES``).

Printed: the worker's peak resident memory (the kernel's count for this process's
children: the worker is the only one), its CPU and wall seconds, and the line it printed.
Target: the peak within the worker's bound and under 500 MB (exit 1 otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

from analysis_traces import stream_trace  # noqa: E402

from policy_engine.analysis import summarize_main as worker  # noqa: E402
from policy_engine.runtime.process import summaries  # noqa: E402

TARGET_MB = 500


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=1000.0,
                        help="the trace's size as uncompressed JSON (default: 1000)")
    parser.add_argument("--ops", type=int, default=600, help="operators a step")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps to write instead of --mb")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "bench.pt.trace.json.gz")
        began = time.perf_counter()
        size, steps = stream_trace(path, mb=args.mb, ops=args.ops, steps=args.steps)
        print(f"trace: {size / 1e6:.1f} MB gzipped, {steps} steps of {args.ops} operators, "
              f"made in {time.perf_counter() - began:.1f} s; {os.cpu_count()} cores, load "
              f"average {os.getloadavg()[0]:.2f}")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
        command = [sys.executable, "-m", summaries.WORKER, path]  # the runtime's limits
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        done = subprocess.run(command, capture_output=True, env=env, check=False)
        wall = time.perf_counter() - began
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak = after.ru_maxrss / 1024  # KiB on Linux
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    line = done.stdout.decode("utf-8", "replace")
    found = json.loads(line) if done.returncode == 0 and line else {}
    summary = found.get("summary") or {}
    facts = summary.get("facts") or {}
    print(f"worker: exit {done.returncode}, {cpu:.1f} s CPU, {wall:.1f} s wall, peak "
          f"{peak:.0f} MiB resident (its bound: {worker.MEMORY_BYTES >> 20} MiB of data)")
    print(f"line: {len(line)} bytes (at most {worker.MAX_KEPT_BYTES}); "
          + (f"error: {found['error']}" if "error" in found else
             f"{facts.get('events', 0):,} events, {facts.get('kernels', 0):,} kernels, "
             f"{len(summary.get('steps') or [])} steps listed, "
             f"{facts.get('steps_left_out', 0)} left out"))
    if done.returncode != 0:
        print(done.stderr.decode("utf-8", "replace")[-2000:], file=sys.stderr)
    ok = done.returncode == 0 and "summary" in found and peak <= TARGET_MB
    rate = "" if args.steps else f"; {args.mb / max(cpu, 1e-9):.0f} MB of trace per CPU second"
    print(f"peak {peak:.0f} MiB (target <= {TARGET_MB} MB: {'met' if ok else 'NOT met'})"
          + rate)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
