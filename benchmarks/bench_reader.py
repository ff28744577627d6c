"""The trace reader on generated GPU-shaped traces: runs of events parsed by orjson against
the stdlib's scanner alone, in the same run.

    python benchmarks/bench_reader.py [--ops 6000] [--steps 3] [--repeat 2] [--quick]

Traces come from ``tests/analysis_traces.py`` (4 ranks, about 100 MB of JSON together, and a
gzip copy of each, as torch writes them). Printed:

- MB of text (uncompressed) per CPU second of handing out every event through
  ``TraceReader``, both ways (``chrome_trace.FAST`` on and off), plain and gzipped, the
  best of ``--repeat`` rounds that alternate between the two so drift hits both alike;
- for scale, orjson.loads and json.loads of one whole file held in memory;
- peak memory (VmHWM) of a child process reading the largest trace, each way;
- end to end: the CPU seconds of the whole command ``policy-engine analyze --from-traces
  --jobs 1`` over the four plain traces (a child process: start, imports, every trace read
  and summarised, the answer printed), as MB of trace per CPU second, against
  ``json.load`` of the same four files in this process (best of ``--repeat`` each).

Targets: >= 150 MB per CPU second, >= 1.7x the stdlib's, <= 300 MB per worker; the whole
command >= 2x ``json.load``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

from analysis_traces import write_trace  # noqa: E402

from policy_engine.analysis import chrome_trace  # noqa: E402

TARGET_MBS, TARGET_RATIO, TARGET_MB, TARGET_E2E = 150.0, 1.7, 300, 2.0
# The child's own high-water mark (VmHWM, in kB): getrusage's ru_maxrss would carry the
# parent's peak across fork and exec.
_PEAK = """
import sys
from policy_engine.analysis import chrome_trace
chrome_trace.FAST = sys.argv[2] == "fast"
def hwm():
    with open("/proc/self/status") as f:
        return next(line.split()[1] for line in f if line.startswith("VmHWM:"))
before = hwm()
with chrome_trace.TraceReader(sys.argv[1]) as reader:
    for _ in reader.events():
        pass
print(before, hwm(), reader.count)
"""


def read_all(files: list[str], fast: bool) -> tuple[float, list[tuple[int, int, int]]]:
    """CPU seconds to hand out every event of ``files``; what each reader counted."""
    chrome_trace.FAST = fast
    seen = []
    used = time.process_time()
    for path in files:
        with chrome_trace.TraceReader(path) as reader:
            for _ in reader.events():
                pass
        seen.append((reader.count, reader.bytes_read, reader.position))
    return time.process_time() - used, seen


def ceiling(path: str) -> tuple[float, float]:
    """MB per CPU second of orjson.loads and json.loads of one whole file in memory."""
    with open(path, "rb") as f:
        data = f.read()
    rates = []
    for loads in (_orjson_loads(), json.loads):
        if loads is None:
            rates.append(float("nan"))
            continue
        used = time.process_time()
        loads(data)
        rates.append(len(data) / 1e6 / (time.process_time() - used))
    return rates[0], rates[1]


def _orjson_loads() -> object:
    try:
        import orjson
    except ImportError:
        return None
    return orjson.loads


def peak(path: str, way: str, env: dict[str, str]) -> tuple[float, float, int]:
    out = subprocess.run([sys.executable, "-c", _PEAK, path, way], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    return int(out[0]) / 1024, int(out[1]) / 1024, int(out[2])


def end_to_end(files: list[str], root: str, env: dict[str, str],
               repeat: int) -> tuple[float, float]:
    """CPU seconds of ``policy-engine analyze --from-traces --jobs 1`` over ``files`` (a
    folder of them alone) and of ``json.load`` of each, the best of ``repeat`` rounds."""
    folder = os.path.join(root, "e2e")
    os.makedirs(folder, exist_ok=True)
    for path in files:
        os.link(path, os.path.join(folder, os.path.basename(path)))
    command = [sys.executable, "-m", "policy_engine", "analyze", folder, "--from-traces",
               "--jobs", "1", "--format", "json"]
    best_cmd = best_load = float("inf")
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        best_cmd = min(best_cmd, after.ru_utime - before.ru_utime
                       + after.ru_stime - before.ru_stime)
        used = time.process_time()
        for path in files:
            with open(path, encoding="utf-8") as f:
                json.load(f)
        best_load = min(best_load, time.process_time() - used)
    return best_cmd, best_load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=6000, help="operators per step")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2, help="rounds each way (best kept)")
    parser.add_argument("--quick", action="store_true", help="about 16 MB, one round")
    args = parser.parse_args()
    ops, repeat = (1000, 1) if args.quick else (args.ops, args.repeat)
    if not chrome_trace.FAST:
        print("orjson is not installed: only the stdlib's scanner can be measured")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    root = tempfile.mkdtemp(prefix="bench-reader-")
    try:
        began = time.perf_counter()
        plain, packed = [], []
        for rank in range(4):
            path = os.path.join(root, f"rank{rank}.pt.trace.json")
            write_trace(path, rank, 4, steps=args.steps, ops=ops, gpu=True, slow=1,
                        extra_us=2000.0)
            with open(path, "rb") as f:
                data = f.read()
            with open(path + ".gz", "wb") as f:
                f.write(gzip.compress(data, compresslevel=1, mtime=0))
            plain.append(path)
            packed.append(path + ".gz")
        mb = sum(os.path.getsize(p) for p in plain) / 1e6
        gz_mb = sum(os.path.getsize(p) for p in packed) / 1e6
        print(f"traces: 4 x {mb / 4:.1f} MB of JSON (GPU-shaped: {ops} operators, launches, "
              f"kernels and flows per step, {args.steps} steps), gzipped 4 x {gz_mb / 4:.1f} "
              f"MB; made in {time.perf_counter() - began:.0f} s")
        ways = [True, False] if chrome_trace.FAST else [False]
        best = {(fast, gz): float("inf") for fast in ways for gz in (False, True)}
        counted = {}
        for _ in range(repeat):
            for gz, files in ((False, plain), (True, packed)):
                for fast in ways:
                    took, seen = read_all(files, fast)
                    best[fast, gz] = min(best[fast, gz], took)
                    counted[fast, gz] = seen
        chrome_trace.FAST = bool(ways[0])
        assert len({tuple(seen) for seen in counted.values()}) == 1, counted
        events = sum(n for n, _, _ in counted[ways[0], False])
        print(f"{events:,} events; MB of text per CPU second (best of {repeat}):")
        print(f"  {'':10} {'orjson runs':>12} {'stdlib':>8} {'ratio':>7}")
        rates = {}
        for gz, label in ((False, "plain"), (True, "gzip"), (None, "both")):
            row = []
            for fast in (True, False):
                if fast not in ways:
                    row.append(float("nan"))
                    continue
                took = best[fast, False] + best[fast, True] if gz is None else best[fast, gz]
                row.append((2 * mb if gz is None else mb) / took)
            rates[label] = row
            print(f"  {label:10} {row[0]:12.1f} {row[1]:8.1f} {row[0] / row[1]:6.2f}x")
        fast_rate, slow_rate = rates["both"]
        print(f"targets: >= {TARGET_MBS:.0f} MB per CPU second: {fast_rate:.1f} "
              f"({fast_rate / TARGET_MBS:.2f}x the target; gzip alone {rates['gzip'][0]:.1f}); "
              f">= {TARGET_RATIO}x the stdlib's: {fast_rate / slow_rate:.2f}x")
        o_rate, j_rate = ceiling(plain[0])
        print(f"  (for scale, one {os.path.getsize(plain[0]) / 1e6:.0f} MB file loaded whole: "
              f"orjson.loads {o_rate:.1f}, json.loads {j_rate:.1f} MB per CPU second)")
        largest = max(plain, key=os.path.getsize)
        for path, way in ((largest, "fast"), (largest + ".gz", "fast"), (largest, "stdlib")):
            if way == "fast" and not chrome_trace.FAST:
                continue
            start_mb, peak_mb, n = peak(path, way, env)
            print(f"peak memory of a worker reading {os.path.basename(path)} "
                  f"({os.path.getsize(largest) / 1e6:.0f} MB of text, {n:,} events, {way}): "
                  f"{peak_mb:.0f} MB, of which {start_mb:.0f} MB is the interpreter with its "
                  f"imports (target <= {TARGET_MB})")
        took, loaded = end_to_end(plain, root, env, repeat)
        print(f"end to end, MB of trace per CPU second (best of {repeat}): policy-engine "
              f"analyze --from-traces --jobs 1 {mb / took:.1f} (the whole command, "
              f"{took:.2f} s), json.load of the same files {mb / loaded:.1f}: "
              f"{loaded / took:.2f}x (target >= {TARGET_E2E}x)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
