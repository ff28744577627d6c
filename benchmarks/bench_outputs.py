"""`policy-engine traces` and `policy-engine report` over a simulated 4,096-rank run.

    python benchmarks/bench_outputs.py [--ranks N] [--steps 2,3,4] [--no-traces] [--local]

The run is made without torch: one manifest per process under ``<dir>/manifests/``, in
the very line format the runtime writes (open, trace and close lines, encoded by
``policy_engine.runtime.process.manifest.encode``), with a tiny Chrome trace per capture. A few
ranks fail, are cut short, run out of memory or are killed, as on a real job. Each
command runs in a child process (as a user runs it); the seconds and the child's peak
RSS are printed. Target: each command <= 10 s and <= 500 MB at 4,096 ranks.

``--local`` names the manifests after this host (pids that are mostly not running), so
the liveness check of every writer is paid too.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

from policy_engine.files.layout import MANIFEST_DIR, MANIFEST_SUFFIX, host_name
from policy_engine.runtime.process.manifest import encode

STAMP = "20261130010705"
BEGAN = 1796000000.0
TARGET_S, TARGET_MB = 10.0, 500
#: rank -> (step, what happens), for the ranks that do not simply complete.
TROUBLE = {17: (3, "failed"), 100: (4, "partial"), 2048: (2, "oom"), 4000: (4, "killed")}


def tiny_trace(rank: int, step: int) -> bytes:
    """A Chrome trace of a few nested operators on one thread, as torch writes them."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": rank,
         "tid": 1, "ts": 0.0, "dur": 100.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": rank, "tid": 1,
         "ts": 1.0, "dur": 60.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": rank, "tid": 1,
         "ts": 2.0, "dur": 50.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": rank, "tid": 1,
         "ts": 70.0, "dur": 20.0},
    ]
    return json.dumps({"schemaVersion": 1, "traceEvents": events}).encode()


def make_run(root: str, ranks: int = 4096, steps: tuple[int, ...] = (2, 3, 4), *,
             traces: bool = True, local: bool = False, role: str = "actor",
             trouble: dict[int, tuple[int, str]] | None = None) -> int:
    """Write a simulated run of ``ranks`` processes under ``root``; returns how many
    entries `traces` lists for it (trace lines, and captures that never closed).
    ``trouble`` (default TROUBLE) says which rank has which mishap at which step."""
    trouble = TROUBLE if trouble is None else trouble
    os.makedirs(os.path.join(root, MANIFEST_DIR), exist_ok=True)
    captures = 0
    for rank in range(ranks):
        pid = 1_000_000 + rank  # above any real pid: nothing on this host writes them
        host = host_name() if local else f"node{rank // 8:04d}"
        identity = {
            "role": role, "rank": rank, "world": ranks, "coords": {"dp": rank},
            "local_rank": rank % 8, "node": rank // 8, "backend": "torch",
            "plan_hash": f"{rank % 7:016x}", "policy_file": "profile_policy.yaml",
            "policy_hash": "6d76f6207b7d1d74", "policy_file_hash": "822cda148a50268d",
            "pid": pid}
        lines: list[bytes] = []
        for i, step in enumerate(steps, 1):
            cid, start = f"{pid}-{i}", BEGAN + step * 10 + rank / 1e4
            what = trouble[rank][1] if trouble.get(rank, (None,))[0] == step else "complete"
            lines.append(encode(dict(identity, event="open", capture=cid, roles=[role],
                                     region=None, steps=[step], host=host,
                                     thread="MainThread", start=start)))
            if what == "killed":  # SIGKILL: an open line and nothing else
                captures += 1
                continue
            name = f"run_{role}_step{step}_rank{rank}-of-{ranks}_pid{pid}_{STAMP}{i:03d}"
            files = [] if what == "failed" else [(name + ".pt.trace.json.gz", "torch",
                                                  "partial" if what == "partial" else
                                                  "complete")]
            if what == "oom":
                files.append((name + "_oom.pickle", "memory", "oom"))
            for path, backend, status in files:
                data = tiny_trace(rank, step) if backend == "torch" else b"\x80\x04N."
                if path.endswith(".gz"):
                    data = gzip.compress(data, mtime=0)
                if traces:
                    with open(os.path.join(root, path), "wb") as f:
                        f.write(data)
                lines.append(encode(dict(
                    identity, event="trace", capture=cid, roles=[role], region=None,
                    path=path, bytes=len(data), cycle=0, inner_steps=[0, 1],
                    status=status, start=start, end=start + 1, steps=[step], joined=[],
                    backend=backend)))
            if what == "failed":
                lines.append(encode(dict(
                    identity, event="trace", capture=cid, roles=[role], region=None,
                    path=None, bytes=None, cycle=0, inner_steps=[], status="failed",
                    start=start, end=start, steps=[step], joined=[],
                    error="RuntimeError: CUPTI_ERROR_NOT_INITIALIZED")))
            captures += max(len(files), 1)
            status = {"failed": "failed", "partial": "partial"}.get(what, "complete")
            close: dict[str, Any] = {"event": "close", "capture": cid, "status": status,
                                     "end": start + 2, "steps": [step],
                                     "traces": max(len(files), 1), "joined": []}
            if what == "failed":
                close["error"] = "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"
            lines.append(encode(close))
        name = f"{host}_pid{pid}_{STAMP}{MANIFEST_SUFFIX}"
        with open(os.path.join(root, MANIFEST_DIR, name), "wb") as f:
            f.write(b"".join(lines))
    return captures


def measure(argv: list[str]) -> tuple[float, float]:
    """Seconds and peak RSS (MB) of one child process running ``argv``."""
    code = ("import resource, subprocess, sys, time\n"
            "t = time.perf_counter()\n"
            "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)\n"
            "print(time.perf_counter() - t,"
            " resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                          text=True, check=True)
    seconds, kib = done.stdout.split()
    return float(seconds), int(kib) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--steps", default="2,3,4")
    parser.add_argument("--no-traces", action="store_true", help="write no trace files")
    parser.add_argument("--local", action="store_true", help="manifests named after this host")
    args = parser.parse_args()
    steps = tuple(int(s) for s in args.steps.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        run = os.path.join(tmp, "run")
        began = time.perf_counter()
        captures = make_run(run, args.ranks, steps, traces=not args.no_traces,
                            local=args.local)
        print(f"{args.ranks} ranks, {captures} captures written in "
              f"{time.perf_counter() - began:.1f} s")
        cli = [sys.executable, "-m", "policy_engine"]
        ok = True
        for label, argv in (("traces", [*cli, "traces", run]),
                            ("traces --format json", [*cli, "traces", run, "--format", "json"]),
                            ("report", [*cli, "report", run, "-o",
                                        os.path.join(tmp, "report.html")])):
            seconds, mb = measure(argv)
            fine = seconds <= TARGET_S and mb <= TARGET_MB
            ok = ok and fine
            print(f"{label:22s} {seconds:6.2f} s  peak RSS {mb:6.1f} MB"
                  f"{'' if fine else '  OVER TARGET'}")
        size = os.path.getsize(os.path.join(tmp, "report.html"))
        print(f"report.html: {size / 2**20:.1f} MiB; this process: "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
