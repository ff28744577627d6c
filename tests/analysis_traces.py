"""Generated runs for the analysis tests and benchmark: Chrome traces shaped like torch's
(nested CPU operators with their args, kernel launches and kernels with correlation ids
and flows, c10d collectives with gloo or NCCL), one per rank per window, with manifests in
the runtime's own line format.

Every rank computes for ``compute_us`` per step (the slow rank ``extra_us`` more), then
all-reduces: a rank waits in the collective until the last one arrives, plus the transfer.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
from typing import Any

from policy_engine.files.layout import MANIFEST_DIR, MANIFEST_SUFFIX
from policy_engine.runtime.process.manifest import encode

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1"
OPS = ("aten::linear", "aten::addmm", "aten::relu", "aten::mul", "aten::add_", "aten::sum")
TRANSFER_US = 300.0
GAP_US = 50.0
#: Kernels and their launches share a correlation id; CUPTI's are large numbers.
CORRELATION = 1_000_000


def _op(name: str, ts: float, dur: float, tid: int, n: int, cat: str = "cpu_op") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": tid, "ts": round(ts, 3),
            "dur": round(dur, 3), "args": {"External id": n, "Record function id": 0,
                                           "Sequence number": n, "Fwd thread id": 0,
                                           "Ev Idx": n}}


def _kernel(name: str, ts: float, dur: float, stream: int, n: int) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream,
            "ts": round(ts, 3), "dur": round(dur, 3),
            "args": {"queued": 0, "device": 0, "context": 1, "stream": stream,
                     "correlation": CORRELATION + n, "registers per thread": 168,
                     "shared memory": 0, "blocks per SM": 1.2, "warps per SM": 4.8,
                     "grid": [132, 1, 1],
                     "block": [128, 1, 1], "est. achieved occupancy %": 6}}


def trace_events(rank: int, world: int, *, steps: int = 3, ops: int = 60, gpu: bool = False,
                 compute_us: float = 5000.0, extra_us: float = 0.0, slow: int | None = None,
                 profiler_steps: bool = True, comm: str | None = "gloo",
                 comm_kernel: str = NCCL, idle: bool = False,
                 trailing: bool = False) -> list[dict[str, Any]]:
    """The events of rank ``rank``'s trace: ``steps`` steps of ``ops`` operators each.
    ``idle``: the slow rank's extra time is a gap (descheduled), not operators.
    ``trailing``: a last, empty ProfilerStep, as the engine's captures end."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 100, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": 1, "args": {"name": "main"}}]
    n = 0
    t = 1_000_000.0
    for step in range(steps):
        mine = [compute_us + (extra_us if r == slow else 0.0) for r in range(world)]
        arrive = t + mine[rank]
        done = t + max(mine) + TRANSFER_US
        if profiler_steps:
            events.append(_op(f"ProfilerStep#{step}", t, done - t + GAP_US / 2, 1, n,
                              "user_annotation"))
        events.append(_op("update_actor", t + 1, done - t - 2, 1, n, "user_annotation"))
        each = (compute_us if idle else mine[rank]) / ops
        for i in range(ops):
            n += 1
            start = t + i * each
            events.append(_op(OPS[i % len(OPS)], start + 1, each - 2, 1, n))
            events.append(_op("aten::empty", start + 2, 1.0, 1, n + 100000))
            if gpu:
                events.append(_launch(start + 3, n))
                events.append(_kernel(GEMM, start + 10, each - 12, 7, n))
                events.append({"ph": "s", "id": n, "pid": 100, "tid": 1, "ts": start + 3,
                               "cat": "ac2g", "name": "ac2g"})
                events.append({"ph": "f", "id": n, "pid": 0, "tid": 7, "ts": start + 10,
                               "cat": "ac2g", "name": "ac2g", "bp": "e"})
        if comm is not None:
            n += 1
            if gpu:
                events.append(_op("c10d::allreduce_", arrive, 20.0, 1, n))
                events.append(_launch(arrive + 2, n))
                events.append(_op("nccl:all_reduce", arrive + 1, 15.0, 1, n,
                                  "user_annotation"))
                kernel = _kernel(comm_kernel, arrive + 10, done - arrive - 10, 20, n)
                # what torch's NCCL kernels carry (as HTA's nccl_data trace shows them)
                kernel["args"].update({
                    "Collective name": "allreduce", "In msg nelems": 1 << 20,
                    "Out msg nelems": 1 << 20, "Group size": world, "dtype": "Float",
                    "Process Group Name": "0", "Process Group Description": "default_pg",
                    "Process Group Ranks": str(list(range(world)))})
                events.append(kernel)
            else:
                events.append(_op("c10d::allreduce_", arrive, 30.0, 1, n))
                events.append(_op(f"{comm}:all_reduce", arrive + 5, done - arrive - 5, 2, n,
                                  "user_annotation"))
        t = done + GAP_US
    if profiler_steps and trailing:  # the engine's last marker: from the last step() to the end
        events.append(_op(f"ProfilerStep#{steps}", t, 100.0, 1, n + 1, "user_annotation"))
    return events


def _launch(ts: float, n: int) -> dict[str, Any]:
    launch = _op("cudaLaunchKernel", ts, 4.0, 1, n, "cuda_runtime")
    launch["args"]["correlation"] = CORRELATION + n
    return launch


def write_trace(path: str, rank: int, world: int, *, distributed_info: bool = True,
                **shape: Any) -> int:
    """A trace file (gzipped when ``path`` ends with .gz); its size."""
    doc: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": []}
    if distributed_info:
        doc["distributedInfo"] = {"backend": "nccl" if shape.get("gpu") else "gloo",
                                  "rank": rank, "world_size": world}
    doc["traceEvents"] = trace_events(rank, world, **shape)
    doc["baseTimeNanoseconds"] = 1790000000000000000
    data = json.dumps(doc).encode()
    if path.endswith(".gz"):
        data = gzip.compress(data, compresslevel=1, mtime=0)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def make_run(root: str, world: int, windows: int = 1, *, role: str = "trainer",
             ranks: list[int] | None = None, missing: dict[int, list[int]] | None = None,
             trigger: str = "plan", request: str | None = None, gz: bool = True,
             notes: list[dict[str, Any]] | None = None, **shape: Any) -> list[str]:
    """A run of ``world`` ranks (or those of ``ranks``) with ``windows`` windows (outer
    steps 1, 2, ...); ``missing`` maps a window's step to ranks that record nothing in
    it. Manifests as the runtime writes them; the trace paths, in order."""
    os.makedirs(os.path.join(root, MANIFEST_DIR), exist_ok=True)
    paths = []
    for rank in ranks if ranks is not None else range(world):
        pid = 10_000 + rank
        identity = {"role": role, "roles": [role], "rank": rank, "world": world,
                    "coords": {}, "backend": "torch", "pid": pid, "region": None,
                    "plan_hash": "0" * 16, "trigger": trigger}
        if request is not None:
            identity["request"] = request
        lines = []
        for step in range(1, windows + 1):
            if rank in (missing or {}).get(step, []):
                continue
            cid = f"{pid}-{step}"
            rel = f"{role}/step{step}/run_rank{rank}-of-{world}_pid{pid}.pt.trace.json" + (
                ".gz" if gz else "")
            size = write_trace(os.path.join(root, rel), rank, world, **shape)
            paths.append(rel)
            lines.append(encode(dict(identity, event="open", capture=cid, steps=[step],
                                     start=1.0 + step)))
            lines.append(encode(dict(identity, event="trace", capture=cid, path=rel,
                                     bytes=size, cycle=0, inner_steps=[0, 1, 2],
                                     status="complete", start=1.0 + step, end=2.0 + step,
                                     steps=[step], joined=[])))
            lines.append(encode({"event": "close", "capture": cid, "status": "complete",
                                 "end": 2.0 + step, "steps": [step], "traces": 1,
                                 "joined": []}))
        for note in notes or []:
            if note.get("rank", rank) == rank:
                lines.append(encode(dict(identity, event="note", **note)))
        name = f"node0_pid{pid}_20261202000000{MANIFEST_SUFFIX}"
        with open(os.path.join(root, MANIFEST_DIR, name), "wb") as f:
            f.write(b"".join(lines))
    return paths


def _calls(rank: int, world: int, count: int, slow: int, late_us: float) -> dict[str, Any]:
    """A collective record of ``count`` all-reduces of one group of ``world`` ranks, as a
    rank's summary holds it, rank ``slow`` arriving ``late_us`` after the others."""
    starts = [i * 1000.0 + (late_us if rank == slow else 0.0) for i in range(count)]
    ends = [i * 1000.0 + late_us + 200.0 for i in range(count)]
    return {"source": "nccl", "clock": "device", "numbered": "seq", "base_us": 1.0e6,
            "groups": [{"name": "0", "desc": "default_pg", "size": world,
                        "ranks": [[0, 1, world]]}],
            "names": ["allreduce"], "dtypes": ["Float"],
            "calls": {"group": [0] * count, "number": list(range(1, count + 1)),
                      "name": [0] * count, "dtype": [0] * count, "bytes": [1 << 22] * count,
                      "issue": [None] * count, "start": starts, "end": ends},
            "folded": [], "total": count, "p2p": 0, "capped": False, "problems": []}


def make_summarised_run(root: str, world: int, *, slow: int = 1, windows: int = 1,
                        calls: int | None = None, **shape: Any) -> None:
    """``windows`` windows of ``world`` ranks as their manifests hold them when each rank
    summarised its trace and kept only the summary (``keep: summaries``): no trace on
    disk. The summaries are those of real generated traces (one of the slow rank, one of
    the others, each with its rank's ``distributedInfo``); ``calls``: each summary's
    collective calls replaced by that many all-reduces of the whole world, the slow rank
    arriving late to each."""
    import tempfile

    from policy_engine.analysis import summarize

    figures = {}
    with tempfile.TemporaryDirectory() as scratch:
        for key in (True, False):
            path = os.path.join(scratch, f"{key}.pt.trace.json")
            write_trace(path, slow if key else (slow + 1) % world, world, slow=slow,
                        **shape)
            figures[key] = summarize(path)
    os.makedirs(os.path.join(root, MANIFEST_DIR), exist_ok=True)
    for rank in range(world):
        pid = 10_000 + rank
        identity = {"role": "trainer", "roles": ["trainer"], "rank": rank, "world": world,
                    "coords": {}, "backend": "torch", "pid": pid, "region": None,
                    "plan_hash": "0" * 16, "trigger": "plan"}
        lines = []
        for window in range(1, windows + 1):
            cid = f"{pid}-{window}"
            rel = f"trainer/step{window}/run_rank{rank}-of-{world}_pid{pid}.pt.trace.json.gz"
            summary = json.loads(json.dumps(figures[rank == slow]))
            summary["facts"]["distributed_info"]["rank"] = rank
            if calls is not None:
                summary["collectives"] = _calls(rank, world, calls, slow, 300.0)
            start = 2.0 * window
            lines += [
                encode(dict(identity, event="open", capture=cid, steps=[window],
                            start=start)),
                encode(dict(identity, event="trace", capture=cid, path=rel,
                            bytes=summary["bytes"], cycle=0, inner_steps=[0, 1, 2],
                            status="complete", start=start, end=start + 1, steps=[window],
                            joined=[])),
                encode(dict(identity, event="summary", capture=cid, path=rel,
                            status="complete", summary=summary, kept=False, seconds=0.5)),
                encode({"event": "close", "capture": cid, "status": "complete",
                        "end": start + 1, "steps": [window], "traces": 1, "joined": []}),
            ]
        name = f"node{rank // 8}_pid{pid}_20261202000000{MANIFEST_SUFFIX}"
        with open(os.path.join(root, MANIFEST_DIR, name), "wb") as f:
            f.write(b"".join(lines))


def stream_trace(path: str, *, mb: float, ops: int = 600, gpu: bool = True,
                 steps: int | None = None) -> tuple[int, int]:
    """A large GPU-shaped trace written as a stream (never held whole): steps of ``ops``
    operators, each a CPU operator, its kernel launch and a kernel of its own on stream 7
    (kernels apart from each other, so none merge), and an NCCL all-reduce kernel a
    step, until about ``mb`` MB of JSON (or ``steps`` steps); gzipped when ``path`` ends
    with .gz. Returns (bytes on disk, steps written)."""
    opened: Any = functools.partial(gzip.open, compresslevel=1) if path.endswith(".gz") \
        else open
    # Lean events (few args), so that a gigabyte holds millions of kernels and operators.
    op = ('{"ph": "X", "cat": "cpu_op", "name": "%s", "pid": 100, "tid": 1, "ts": %.3f, '
          '"dur": %.3f, "args": {"External id": %d}},\n')
    launch = ('{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, '
              '"tid": 1, "ts": %.3f, "dur": 4.0, "args": {"correlation": %d}},\n')
    kernel = ('{"ph": "X", "cat": "kernel", "name": "%s", "pid": 0, "tid": %d, "ts": %.3f, '
              '"dur": %.3f, "args": {"stream": %d, "correlation": %d}},\n')
    written, target, n, t, step = 0, int(mb * 1e6), 0, 1_000_000.0, 0
    with opened(path, "wb") as out:
        head = b'{"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, ' \
            b'"world_size": 8}, "traceEvents": [\n'
        out.write(head)
        written += len(head)
        while (written < target) if steps is None else (step < steps):
            chunk = [op.replace('"cpu_op"', '"user_annotation"', 1) % (
                f"ProfilerStep#{step}", t, ops * 20.0 + 400.0, n)]
            for i in range(ops):
                n += 1
                start = t + i * 20.0
                chunk.append(op % (OPS[i % len(OPS)], start + 1, 18.0, n))
                if gpu:
                    chunk.append(launch % (start + 3, CORRELATION + n))
                    chunk.append(kernel % (GEMM, 7, start + 10, 9.0, 7, CORRELATION + n))
            if gpu:
                n += 1
                end = t + ops * 20.0
                chunk.append(kernel % (NCCL, 20, end - 100.0, 300.0, 20, CORRELATION + n))
            data = "".join(chunk).encode()
            out.write(data)
            written += len(data)
            t += ops * 20.0 + 500.0
            step += 1
        tail = b'{"ph": "M", "name": "process_name", "pid": 100, "args": {"name": "x"}}' \
            b'], "baseTimeNanoseconds": 1790000000000000000}'
        out.write(tail)
    return os.path.getsize(path), step
