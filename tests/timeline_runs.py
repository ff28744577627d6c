"""Generated RL-shaped runs for the timeline tests: per rank and step a torch-shaped
Chrome trace whose regions (``user_annotation`` ranges, named in the trace's
``policy_engine`` metadata as the runtime names them) are the phases given, with gloo
collectives where a phase begins or ends waiting; manifests in the runtime's own line
format, with each rank's summary (``keep: summaries``: no trace left on disk) and its
``clock`` notes.

A rank's phases are given in milliseconds on the job's clock; ``skew`` moves a rank's host
clock (its traces' timestamps) by that many milliseconds, as a host whose clock is off
would, and its clock note (when ``measured``) says the offset that brings it back.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from policy_engine.analysis import summarize
from policy_engine.files.layout import MANIFEST_DIR, MANIFEST_SUFFIX
from policy_engine.runtime.process.manifest import encode

BASE_NS = 1_790_000_000_000_000_000
#: (name, start ms, end ms, lead ms, tail ms): lead/tail, the collective it begins or ends in
Phase = tuple[str, float, float, float, float]


def phase(name: str, start: float, end: float, lead: float = 0.0, tail: float = 0.0) -> Phase:
    return (name, start, end, lead, tail)


def trace_doc(rank: int, world: int, phases: Sequence[Phase], span: tuple[float, float],
              skew_ms: float = 0.0, marked: bool = True) -> dict[str, Any]:
    """A rank's trace: its recorded extent ``span`` (ms), each phase a user annotation
    with an operator inside, and a gloo collective over its lead and its tail."""
    origin = 5_000_000.0  # µs: where the trace's timestamps start, as kineto's do
    def at(ms: float) -> float:
        return round(origin + ms * 1000.0, 3)
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1,
         "ts": at(span[0]), "dur": 1.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1,
         "ts": at(span[1]) - 1.0, "dur": 1.0}]
    for name, start, end, lead, tail in phases:
        events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1,
                       "ts": at(start), "dur": round((end - start) * 1000.0, 3)})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                       "ts": at(start + lead), "dur": 100.0})
        for lo, hi in ((start, start + lead), (end - tail, end)):
            if hi > lo:
                events.append({"ph": "X", "cat": "cpu_op", "name": "gloo:all_reduce",
                               "pid": 1, "tid": 7, "ts": at(lo),
                               "dur": round((hi - lo) * 1000.0, 3)})
    events.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1,
                   "tid": 1, "ts": at(span[0]), "dur": round((span[1] - span[0]) * 1000.0, 3)})
    meta: dict[str, Any] = {"role": "x", "rank": rank, "world": world}
    if marked:
        meta["region_ranges"] = sorted({p[0] for p in phases})
    return {"schemaVersion": 1, "baseTimeNanoseconds": BASE_NS + round(skew_ms * 1e6),
            "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world},
            "policy_engine": meta, "traceEvents": events}


def make_rl_run(root: str, world: int, steps: Mapping[int, Mapping[int, tuple[str, Sequence[Phase],
                                                                        tuple[float, float]]]],
                *, skew: Mapping[int, float] | None = None,
                measured: Sequence[int] | None = None, uncertainty_us: float = 150.0,
                keep_traces: bool = False, marked: bool = True) -> None:
    """``steps``: step -> rank -> (role label, phases, recorded span). ``measured``: the
    ranks that noted a clock reading (default: every rank); rank 0 is the reference."""
    skew = skew or {}
    measured = list(range(world)) if measured is None else list(measured)
    os.makedirs(os.path.join(root, MANIFEST_DIR), exist_ok=True)
    lines: dict[int, list[bytes]] = {r: [] for r in range(world)}
    for step, ranks in steps.items():
        for rank, (label, phases, span) in ranks.items():
            roles = label.split("+")
            pid = 10_000 + rank
            identity = {"role": roles[0], "roles": roles, "rank": rank, "world": world,
                        "coords": {}, "backend": "torch", "pid": pid, "region": None,
                        "plan_hash": "0" * 16, "trigger": "plan"}
            cid = f"{pid}-{step}"
            rel = f"{label}/step{step}/t_rank{rank}-of-{world}_pid{pid}.pt.trace.json"
            doc = trace_doc(rank, world, phases, span, skew.get(rank, 0.0), marked)
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                json.dump(doc, f)
            summary = summarize(path)
            assert "error" not in summary, summary
            if not keep_traces:
                os.unlink(path)
            start = 1_790_000_000.0 + step  # the open line's time (seconds)
            lines[rank] += [
                encode(dict(identity, event="open", capture=cid, steps=[step], start=start)),
                encode(dict(identity, event="trace", capture=cid, path=rel, bytes=100,
                            cycle=0, inner_steps=[0], status="complete", start=start,
                            end=start + 1, steps=[step], joined=[])),
                encode(dict(identity, event="summary", capture=cid, path=rel,
                            status="complete", summary=summary, kept=keep_traces,
                            seconds=0.1)),
                encode({"event": "close", "capture": cid, "status": "complete",
                        "end": start + 1, "steps": [step], "traces": 1, "joined": []})]
    for rank in measured:
        ours = {"role": "x", "rank": rank, "world": world, "pid": 10_000 + rank}
        offset = -skew.get(rank, 0.0) * 1000.0
        lines[rank].append(encode(dict(
            ours, event="note", note="clock", offset_us=offset,
            uncertainty_us=0.0 if rank == 0 else uncertainty_us, rounds=0 if rank == 0 else 5,
            reference_rank=0, why="reference" if rank == 0 else "start", channel="store",
            measured_at=1_790_000_000.0 + skew.get(rank, 0.0) / 1000.0,
            time=1_790_000_000.0)))
    for rank, found in lines.items():
        if found:
            name = f"node0_pid{10_000 + rank}_20261202000000{MANIFEST_SUFFIX}"
            with open(os.path.join(root, MANIFEST_DIR, name), "wb") as f:
                f.write(b"".join(found))


def rl_step(gen: float = 600.0, ref: float = 120.0, upd: float = 250.0,
            late: Mapping[int, float] | None = None) -> dict[int, tuple[str, list[Phase],
                                                                   tuple[float, float]]]:
    """One step of the verl-shaped job the end-to-end test runs, on 4 ranks: rollout on
    ranks 2-3 generates, the actor+ref ranks 0-1 wait for its batch in no phase, compute
    the ref's log-probs and update; the rollout ranks wait in sync_weights (a lead) for the
    new weights. ``late``: ms a rank's phases start later (its own lateness)."""
    late = late or {}
    done = gen + 10.0  # the batch arrives
    upd_end = done + ref + upd
    out: dict[int, tuple[str, list[Phase], tuple[float, float]]] = {}
    for rank in (0, 1):
        d = late.get(rank, 0.0)
        out[rank] = ("actor+ref", [phase("ref_compute_log_prob", done + d, done + ref + d),
                                   phase("actor_update", done + ref + d, upd_end + d, tail=5)],
                     (0.0, upd_end + 20.0))
    for rank in (2, 3):
        d = late.get(rank, 0.0)
        out[rank] = ("rollout", [phase("generate_sequences", d, gen + d),
                                 phase("sync_weights", gen + 2 + d, upd_end + 15.0,
                                       lead=upd_end + 12.0 - gen - 2 - d)],
                     (0.0, upd_end + 20.0))
    return out


def scratch() -> str:
    return tempfile.mkdtemp(prefix="timeline-")
