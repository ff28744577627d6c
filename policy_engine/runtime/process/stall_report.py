"""What this process writes when a step stalls: its stall record, made on the role's listener
thread while the training thread is blocked (docs/runtime.md, Stalls).

The record (:class:`~policy_engine.analysis.stall_record.StallRecord`, whose bounds this
module cuts everything to) holds every thread's Python stack (``sys._current_frames``: no
thread is stopped or asked anything), the training thread's marked; the last collective
call the training thread entered and whether it returned, from torch's flight recorder,
which c10d keeps for every process group of every backend (gloo included on torch 2.13),
read once without stack traces (a few hundred milliseconds for its 2,000 calls); and the
process groups' members and last call numbers. Where there is no flight recorder, the
training thread's stack says whether it is inside a torch.distributed collective, by name.

Files are published whole under ``<output_dir>/stalls/`` (files.publish): a record
survives a ``kill -9`` once written. Nothing here raises: a part that cannot be read says
why in the record.
"""

from __future__ import annotations

import json
import linecache
import os
import pickle
import sys
import sysconfig
import threading
import time
from collections.abc import Mapping
from types import FrameType
from typing import Any

from policy_engine.analysis.format import rank_spans
from policy_engine.analysis.stall_record import (
    CLEARED_SUFFIX,
    MAX_CALLS,
    MAX_FILE_BYTES,
    MAX_FRAMES,
    MAX_GROUPS,
    MAX_THREADS,
    Call,
    Cleared,
    Frame,
    Group,
    RollCall,
    StallRecord,
    Thread,
    cut,
)
from policy_engine.files.layout import STALLS_DIR, host_name
from policy_engine.files.publish import write_atomic

__all__ = ["collectives", "record", "stacks", "write_cleared", "write_record",
           "write_roll_call"]

#: Frames walked per thread at most (a deeper stack is counted up to here).
_DEPTH = 10_000
#: torch.distributed's module whose functions are the collectives (the stack's fallback).
_C10D = os.path.join("torch", "distributed", "distributed_c10d.py")


class _Roots:
    """Where code that is not the job's own lives: the standard library (less the
    installed packages under it), torch and policy-engine."""

    def __init__(self) -> None:
        paths = sysconfig.get_paths()
        here = os.path.abspath(__file__)
        for _ in range(3):  # policy_engine/runtime/process/this.py -> policy_engine
            here = os.path.dirname(here)
        always = [here]
        torch = sys.modules.get("torch")
        where = getattr(torch, "__file__", None)
        if isinstance(where, str):
            always.append(os.path.dirname(os.path.abspath(where)))
        self.always = tuple(_folder(p) for p in always)
        self.stdlib = tuple(_folder(p) for p in {paths.get("stdlib"), paths.get("platstdlib")}
                            if p)
        self.packages = tuple(_folder(p) for p in {paths.get("purelib"), paths.get("platlib")}
                              if p)

    def own(self, file: str) -> bool:
        """Whether ``file`` is the job's own code."""
        if file.startswith("<"):
            return False
        path = os.path.abspath(file)
        if path.startswith(self.always):
            return False
        return not path.startswith(self.stdlib) or path.startswith(self.packages)


def _folder(path: str) -> str:
    return os.path.abspath(path).rstrip(os.sep) + os.sep


def _frames(frame: FrameType | None, roots: _Roots) -> tuple[list[Frame], int]:
    """A stack, innermost first, cut to :data:`MAX_FRAMES`; and how many were left out."""
    out: list[Frame] = []
    depth = 0
    while frame is not None and depth < _DEPTH:
        if depth < MAX_FRAMES:
            code = frame.f_code
            file, line = code.co_filename, frame.f_lineno or 0
            source = linecache.getline(file, line).strip() if line else ""
            out.append(Frame(cut(file), line, cut(getattr(code, "co_qualname", code.co_name)),
                             cut(source), roots.own(file)))
        depth += 1
        frame = frame.f_back
    return out, depth - len(out)


def stacks(training: int | None) -> tuple[list[Thread], int]:
    """Every thread's stack, the training thread (``training``: its ident) first, then
    the main thread, then the others by name; at most :data:`MAX_THREADS`, and how many
    more there were."""
    roots = _Roots()
    found = sys._current_frames()
    known = {t.ident: t for t in threading.enumerate()}
    main = threading.main_thread().ident

    def order(ident: int) -> tuple[int, str]:
        thread = known.get(ident)
        return (0 if ident == training else 1 if ident == main else 2,
                thread.name if thread is not None else "")
    threads: list[Thread] = []
    for ident in sorted(found, key=order)[:MAX_THREADS]:
        frames, left_out = _frames(found[ident], roots)
        thread = known.get(ident)
        threads.append(Thread(cut(thread.name if thread is not None else f"thread {ident}"),
                              ident, ident == training,
                              bool(thread is not None and thread.daemon), tuple(frames),
                              left_out))
    del found
    return threads, max(0, len(known) - MAX_THREADS)


def _from_stack(threads: list[Thread], training: int | None) -> Call | None:
    """The collective the training thread is inside, by the name of torch.distributed's
    function on its stack (no group, no number: the stack does not say them)."""
    thread = next((t for t in threads if t.ident == training), None)
    if thread is None:
        return None
    inside = next((f for f in thread.frames if f.file.endswith(_C10D)), None)
    if inside is None:
        return None
    return Call(inside.function.rpartition(".")[2], False, "stack", thread=training)


def _call(entry: Mapping[str, Any]) -> Call:
    group = entry.get("process_group") or ("", "")
    name = str(entry.get("profiling_name") or "?")
    created = entry.get("time_created_ns")
    thread = str(entry.get("thread_id") or "")
    seq = entry.get("collective_seq_id")
    return Call(cut(name.partition(":")[2] or name), bool(entry.get("retired")),
                "flight_recorder", cut(group[0]), cut(group[1]),
                seq if isinstance(seq, int) else None,
                created / 1e9 if isinstance(created, int) else None,
                int(thread) if thread.isdigit() and len(thread) < 20 else None)


def _groups(dist: Any, status: Mapping[str, Any]) -> list[Group]:
    """The process groups this process is in: their global ranks (torch's own tables),
    and the last call numbers the flight recorder saw in them."""
    found: dict[str, Group] = {}
    try:
        world = dist.distributed_c10d._world
        names, members = dict(world.pg_names), dict(world.pg_group_ranks)
    except Exception:  # the tables are torch's own: a torch without them says no ranks
        names, members = {}, {}
    for pg, name in list(names.items())[:MAX_GROUPS]:
        ranks = members.get(pg) or {}
        spans = rank_spans(sorted(ranks))
        found[str(name)] = Group(cut(name), cut(getattr(pg, "group_desc", "") or ""),
                                 spans if len(spans) <= 960 else "")
    for name, state in list(status.items())[:MAX_GROUPS]:
        if not isinstance(state, Mapping):
            continue
        old = found.get(str(name)) or Group(cut(name))
        enqueued, completed = (state.get("last_enqueued_collective"),
                               state.get("last_completed_collective"))
        found[str(name)] = Group(old.name, old.desc, old.ranks,
                                 enqueued if isinstance(enqueued, int) else None,
                                 completed if isinstance(completed, int) else None)
    return list(found.values())[:MAX_GROUPS]


def collectives(threads: list[Thread], training: int | None
                ) -> tuple[Call | None, list[Call], list[Group], str]:
    """The training thread's last collective call, the last calls of the process (one per
    group first, then the newest), the process groups, and where these come from (or why
    there are none)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None, [], [], "torch.distributed is not initialised in this process"
        backend = str(dist.get_backend())
        from torch._C import _distributed_c10d as c10d

        dump = getattr(c10d, "_dump_fr_trace", None)
        if dump is None:
            return (_from_stack(threads, training), [], _groups(dist, {}),
                    f"this torch has no flight recorder ({backend}): the training thread's "
                    "stack names the collective it is in, without its group or number")
        data = pickle.loads(dump(True, False, False))  # torch's own bytes, this process
    except Exception as err:
        return (_from_stack(threads, training), [], [],
                cut(f"the flight recorder could not be read ({type(err).__name__}: {err})"))
    data = data if isinstance(data, dict) else {}
    entries = [e for e in data.get("entries") or () if isinstance(e, dict)
               and not e.get("is_p2p")]
    groups = _groups(dist, data.get("pg_status") or {})
    if not entries:
        return (_from_stack(threads, training), [], groups,
                f"the flight recorder holds no calls ({backend}; TORCH_FR_BUFFER_SIZE=0?)")
    mine = [e for e in entries if str(e.get("thread_id")) == str(training)]
    last = _call(mine[-1]) if mine else None
    newest: dict[str, Mapping[str, Any]] = {}
    for e in entries:  # the last call of each group
        newest[str((e.get("process_group") or ("",))[0])] = e
    picked = list(newest.values())[-MAX_CALLS:]
    for e in reversed(entries):
        if len(picked) >= MAX_CALLS:
            break
        if all(e is not p for p in picked):
            picked.append(e)
    picked.sort(key=lambda e: e.get("time_created_ns") or 0)
    return (last, [_call(e) for e in picked], groups,
            f"torch's flight recorder ({backend}), {len(entries)} calls held")


def record(*, why: str, identity: Mapping[str, Any], training: int | None,
           position: Mapping[str, Any], episode: str | None = None,
           asked_by: int | None = None) -> StallRecord:
    """This process's stall record now. ``identity``: role, rank, world; ``position``:
    step, in_step, running, limit, limit_said, region, inner_step, capture."""
    threads, more = stacks(training)
    last, calls, groups, said = collectives(threads, training)
    region = [cut(r) for r in position.get("region") or ()][:16]
    return StallRecord(
        why=why, role=cut(identity["role"]), rank=int(identity["rank"]),
        world=int(identity["world"]), pid=os.getpid(), host=cut(host_name()),
        time=time.time(), episode=episode, asked_by=asked_by, step=position.get("step"),
        in_step=bool(position.get("in_step")), running=position.get("running"),
        limit=position.get("limit"), limit_said=cut(position.get("limit_said") or ""),
        region=tuple(region), inner_step=position.get("inner_step"),
        capture=position.get("capture"), collective=last, collectives=said,
        calls=tuple(calls), groups=tuple(groups), threads=tuple(threads),
        threads_left_out=more)


def _fitted(found: StallRecord) -> bytes:
    """The record's JSON within :data:`MAX_FILE_BYTES`: other threads' stacks are cut to
    their innermost frames, then dropped, until it fits."""
    data = json.dumps(found.to_json()).encode()
    for keep in (8, 2, 0):
        if len(data) <= MAX_FILE_BYTES:
            break
        threads = tuple(t if t.training else Thread(
            t.name, t.ident, t.training, t.daemon, t.frames[:keep],
            t.left_out + len(t.frames) - len(t.frames[:keep])) for t in found.threads)
        data = json.dumps(dict(found.to_json(), threads=[t.to_json() for t in threads])
                          ).encode()
    return data


def _publish(output_dir: str, stem: str, data: bytes, ext: str = ".json") -> str:
    def write(path: str) -> None:
        with open(path, "wb") as f:
            f.write(data)
    path, _size = write_atomic(output_dir, f"{STALLS_DIR}/{stem}", ext, write)
    return path


def write_record(output_dir: str, found: StallRecord) -> str:
    """Publish the record under ``stalls/``; its path (OSError when it cannot be)."""
    stamp = time.strftime("%Y%m%d%H%M%S", time.localtime(found.time))
    millis = int(found.time * 1000) % 1000
    stem = f"{stamp}{millis:03d}_rank{found.rank}_pid{found.pid}"
    return _publish(output_dir, stem, _fitted(found))


def write_cleared(output_dir: str, record_path: str, step: int | None,
                  seconds: float) -> str:
    """Publish the clearing of the record at ``record_path``: its step ended after
    ``seconds``."""
    name = os.path.basename(record_path)
    found = Cleared(cut(name), step, round(seconds, 3), time.time())
    stem = name[:-len(".json")] if name.endswith(".json") else name
    return _publish(output_dir, stem, json.dumps(found.to_json()).encode(), CLEARED_SUFFIX)


def write_roll_call(output_dir: str, found: RollCall) -> str:
    """Publish a roll call under ``stalls/``."""
    stamp = time.strftime("%Y%m%d%H%M%S", time.localtime(found.time))
    return _publish(output_dir, f"{stamp}_rollcall_{found.episode}",
                    json.dumps(found.to_json()).encode())
