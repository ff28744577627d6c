"""The reading commands over runs of very many ranks, answered from the ranks' summaries
alone (``keep: summaries``: no trace on disk), each as a user runs it.

    python benchmarks/bench_scale.py [--ranks 100000] [--quick] [--keep DIR]

Runs come from ``tests/analysis_traces.py`` ``make_summarised_run`` (each rank's manifest
holds the summary of a GPU-shaped trace). Printed, per command: its wall time, its CPU
time (user + system of the child process: what holds on a loaded machine) and its peak
memory (the child's own high-water mark, VmHWM):

- ``analyze --format json`` and ``report`` over ``--ranks`` ranks x 1 window, and
  ``compare`` of two such runs;
- ``analyze --format json`` over 10,000 ranks x 2 windows;
- ``analyze --format json`` over 10,000 ranks x 1 window whose summaries each hold 200
  collective calls, matched across the ranks.

Targets (issue #38 and #40): 100,000 ranks, analyze and report <= 30 s and <= 300 MB,
compare <= 60 s and <= 400 MB; 10,000 ranks x 2 windows <= 5 s and <= 300 MB; 10,000 x 200
calls <= 10 s and <= 500 MB. Times are judged by CPU seconds (the machine's load, printed,
lengthens the wall time).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

from analysis_traces import make_summarised_run  # noqa: E402

# policy-engine as a user runs it, with the process's own peak memory (kB) on stderr.
_CLI_PEAK = """
import sys
from policy_engine.cli.main import main
code = main(sys.argv[1:])
with open("/proc/self/status") as f:
    peak = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
sys.stdout.flush()
print(peak, file=sys.stderr)
sys.exit(code)
"""


def measure(env: dict[str, str], *args: str) -> tuple[float, float, float]:
    """(wall s, CPU s, peak MB) of ``policy-engine ARGS``, its output thrown away."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _CLI_PEAK, *args], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"policy-engine {' '.join(args)} failed: {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, int(done.stderr.split()[-1]) / 1024


def say(what: str, found: tuple[float, float, float], seconds: float, mb: float) -> None:
    wall, cpu, peak = found
    print(f"{what}: {cpu:.1f} s CPU ({wall:.1f} s wall at load {os.getloadavg()[0]:.1f}), "
          f"{peak:.0f} MB peak (targets <= {seconds:.0f} s, <= {mb:.0f} MB: "
          f"{seconds / cpu:.2f}x and {mb / peak:.2f}x headroom)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="10,000 ranks, for a look")
    parser.add_argument("--keep", metavar="DIR", help="make the runs here and keep them")
    args = parser.parse_args()
    ranks = 10_000 if args.quick else args.ranks
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    root = args.keep or tempfile.mkdtemp(prefix="bench-scale-")
    try:
        shape = {"steps": 3, "ops": 200, "gpu": True, "extra_us": 2000.0}
        runs = {"one": (ranks, {}), "two": (ranks, {}), "windows": (10_000, {"windows": 2}),
                "calls": (10_000, {"calls": 200})}
        for name, (world, more) in runs.items():
            folder = os.path.join(root, name)
            if not os.path.isdir(folder):
                began = time.perf_counter()
                make_summarised_run(folder, world, **shape, **more)
                print(f"made {name}: {world} ranks in {time.perf_counter() - began:.0f} s")
        one, two = os.path.join(root, "one"), os.path.join(root, "two")
        say(f"analyze --format json, {ranks:,} ranks x 1 window",
            measure(env, "analyze", one, "--format", "json"), 30, 300)
        page = os.path.join(root, "report.html")
        say(f"report, {ranks:,} ranks x 1 window",
            measure(env, "report", one, "-o", page, "--force"), 30, 300)
        say(f"compare, two runs of {ranks:,} ranks",
            measure(env, "compare", one, two, "--format", "json"), 60, 400)
        say("analyze --format json, 10,000 ranks x 2 windows",
            measure(env, "analyze", os.path.join(root, "windows"), "--format", "json"), 5, 300)
        say("analyze --format json, 10,000 ranks x 1 window of 200 collective calls each",
            measure(env, "analyze", os.path.join(root, "calls"), "--format", "json"), 10, 500)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
