"""policy-engine merge: the per-rank torch traces of one capture window as one Chrome trace,
read and written as streams; windows chosen from the manifests; bad input named."""

from __future__ import annotations

import gzip
import json
import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from job_env import child_env

from policy_engine.analysis import chrome_trace
from policy_engine.analysis.chrome_trace import TraceError, TraceReader
from policy_engine.cli.main import main
from policy_engine.runtime.process.manifest import append

BASE = 1_790_857_026_000_000_000  # baseTimeNanoseconds as torch writes it
HEAD = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "H200"}],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2}}


def cpu_events(pid: int, ts: float, name: str = "aten::mm") -> list[dict[str, Any]]:
    """A torch-like CPU trace body: names, one op, one user range, a global marker."""
    return [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": ts,
         "args": {"name": "python"}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": ts,
         "args": {"sort_index": pid}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": pid, "ts": ts,
         "args": {"name": f"thread {pid} (python)"}},
        {"ph": "X", "cat": "cpu_op", "name": name, "pid": pid, "tid": pid, "ts": ts,
         "dur": 5.5, "args": {"External id": 3}},
        {"ph": "X", "cat": "user_annotation", "name": "update_actor", "pid": pid, "tid": pid,
         "ts": ts - 1, "dur": 20},
        {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": ts + 30},
    ]


def gpu_events(ts: float) -> list[dict[str, Any]]:
    """A kernel on GPU 0 stream 7, tied to its launch on the CPU by flow id 7."""
    return [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7"}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": ts + 2,
         "dur": 3},
        {"ph": "s", "id": 7, "cat": "ac2g", "name": "ac2g", "pid": 4242, "tid": 4242,
         "ts": ts},
        {"ph": "f", "id": 7, "cat": "ac2g", "name": "ac2g", "pid": 0, "tid": 7, "ts": ts + 2,
         "bp": "e"},
    ]


def write_trace(path: Path, events: list[dict[str, Any]], base: int | None = BASE,
                head: dict[str, Any] | None = None, base_last: bool = False) -> Path:
    """A trace shaped as torch writes it (top-level keys, then traceEvents)."""
    top = dict(HEAD if head is None else head)
    if base is not None and not base_last:
        top["baseTimeNanoseconds"] = base
    text = json.dumps({**top, "traceEvents": events}, indent=1)
    if base is not None and base_last:  # the key after the events
        text = text[:text.rindex("}")] + f', "baseTimeNanoseconds": {base}}}'
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def record(out: Path, rank: int, path: str | None, *, steps: tuple[int, ...] = (2,),
           cycle: int | None = 0, role: str = "actor", backend: str = "torch",
           status: str = "complete", start: float = 100.0, **more: Any) -> None:
    """A manifest trace line, as the runtime appends it."""
    append(str(out), {
        "event": "trace", "capture": f"{rank}-{start}", "role": role, "roles": [role],
        "joined": [], "region": None, "rank": rank, "world": 2, "pid": 4242,
        "coords": {"dp": rank, "tp": 0}, "backend": backend, "steps": list(steps),
        "cycle": cycle, "inner_steps": [0], "path": path, "bytes": 1, "status": status,
        "start": start + rank, "end": start + rank + 1, **more})


def two_ranks(out: Path, steps: tuple[int, ...] = (2,), shift_ns: int = 2_500_000,
              gz: bool = True, start: float = 100.0) -> None:
    """Ranks 0 and 1 of the actor, same pid (as on two hosts), clocks ``shift_ns`` apart."""
    ext = ".pt.trace.json.gz" if gz else ".pt.trace.json"
    for rank in (0, 1):
        name = f"t_actor_step{steps[0]}_rank{rank}{ext}"
        events = cpu_events(4242, 1000.0, f"op_rank{rank}") + gpu_events(1000.0)
        write_trace(out / name, events, base=BASE + rank * shift_ns,
                    head={**HEAD, "distributedInfo": {"rank": rank, "world_size": 2}})
        record(out, rank, name, steps=steps, start=start)


def merge(*args: str) -> int:
    return main(["merge", *[str(a) for a in args]])


def load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data: dict[str, Any] = json.load(f)
    return data


def by_pid(trace: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for event in trace["traceEvents"]:
        out.setdefault(event["pid"], []).append(event)
    return out


def meta(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["ph"] == "M" and e["name"] == name]


# -- the merged trace --------------------------------------------------------------------

def test_two_ranks_become_two_labelled_processes_with_aligned_clocks(
        tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "out"
    two_ranks(out)
    target = tmp_path / "merged.pt.trace.json.gz"
    assert merge(out, "-o", target) == 0
    assert "ranks 0-1 (2 traces" in capsys.readouterr().out
    trace = load(target)
    procs = by_pid(trace)
    assert sorted(procs) == [1, 2]  # one process per rank, though both inputs had pid 4242
    for rank, pid in ((0, 1), (1, 2)):
        events = procs[pid]
        (name,) = meta(events, "process_name")
        assert name["args"]["name"] == f"rank {rank} (actor, dp={rank} tp=0)"
        # each input's own top-level metadata rides on its process, not at the top
        assert name["args"]["metadata"]["distributedInfo"] == {"rank": rank, "world_size": 2}
        assert name["args"]["trace"] == f"t_actor_step2_rank{rank}.pt.trace.json.gz"
        assert [e["args"]["sort_index"] for e in meta(events, "process_sort_index")] == [rank]
        (op,) = [e for e in events if e.get("cat") == "cpu_op"]
        assert op["name"] == f"op_rank{rank}"
        assert op["ts"] == pytest.approx(1000.0 + rank * 2500.0)  # 2.5 ms later clock
    assert "distributedInfo" not in trace and "deviceProperties" not in trace
    assert trace["baseTimeNanoseconds"] == BASE
    assert trace["policy_engine_merge"]["ranks"] == [0, 1]
    assert list(trace)[:2] == ["displayTimeUnit", "traceEvents"]  # events before other keys


def test_one_trace_is_counted_in_the_singular(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "out"
    name = "t_actor_step2_rank0.pt.trace.json"
    write_trace(out / name, cpu_events(4242, 1000.0, "op_rank0"))
    record(out, 0, name)
    target = tmp_path / "merged.pt.trace.json"
    assert merge(out, "-o", target) == 0
    said = capsys.readouterr().out
    assert "rank 0 (1 trace, " in said and "1 traces" not in said
    assert said.rstrip().endswith(f"{len(load(target)['traceEvents'])} events)")


def test_threads_flows_and_markers_never_cross_ranks(tmp_path: Path) -> None:
    out = tmp_path / "out"
    two_ranks(out, gz=False)
    target = tmp_path / "merged.json"
    assert merge(out, "-o", target) == 0
    trace = load(target)
    procs = by_pid(trace)
    tids = [{e["tid"] for e in events if "tid" in e} for events in procs.values()]
    assert not tids[0] & tids[1]  # Perfetto names threads by tid alone
    flows = {pid: {e["id"] for e in events if e["ph"] in "sf"} for pid, events in procs.items()}
    assert all(len(ids) == 1 for ids in flows.values()) and flows[1] != flows[2]
    for events in procs.values():
        names = {e["tid"]: e["args"]["name"] for e in meta(events, "thread_name")}
        assert "thread 4242 (python)" in names.values()
        (kernel,) = [e for e in events if e.get("cat") == "kernel"]
        assert names[kernel["tid"]] == "GPU 0 stream 7"  # GPU streams under the rank
        (end,) = [e for e in events if e["name"] == "Record Window End"]
        assert end["s"] == "p"  # a marker of this rank, not of every process
        assert len(meta(events, "process_name")) == 1  # torch's own names replaced


def test_base_time_after_the_events_and_partial_ns_are_aligned(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for rank, base in ((0, BASE + 1500), (1, BASE)):  # rank 1 starts the clock
        name = f"r{rank}.pt.trace.json"
        write_trace(out / name, cpu_events(10 + rank, 50.0), base=base, base_last=rank == 0)
        record(out, rank, name)
    target = tmp_path / "m.json"
    assert merge(out, "-o", target) == 0
    trace = load(target)
    ops = {e["pid"]: e["ts"] for e in trace["traceEvents"] if e.get("cat") == "cpu_op"}
    assert ops == {1: pytest.approx(51.5), 2: 50.0}
    assert trace["baseTimeNanoseconds"] == BASE


# -- choosing the window -----------------------------------------------------------------

def test_windows_roles_and_steps_are_chosen_or_listed(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "out"
    two_ranks(out, steps=(2,))
    two_ranks(out, steps=(3,), start=200.0)
    record(out, 0, "rollout.nsys-rep", role="rollout", backend="nsight")
    target = tmp_path / "m.json.gz"

    assert merge(out, "-o", target) == 2
    err = capsys.readouterr().err
    assert "2 roles (actor, rollout): choose one with --role" in err

    assert merge(out, "--role", "actr", "-o", target) == 2
    assert "did you mean 'actor'?" in capsys.readouterr().err

    assert merge(out, "--role", "rollout", "-o", target) == 2
    assert "no torch traces" in capsys.readouterr().err

    assert merge(out, "--role", "actor", "-o", target) == 2
    err = capsys.readouterr().err
    assert "2 capture windows of actor match" in err
    assert "\n  step 2, cycle 0: ranks 0-1\n  step 3, cycle 0: ranks 0-1" in err

    assert merge(out, "--role", "actor", "--step", "9", "-o", target) == 2
    assert "step 3, cycle 0: ranks 0-1" in capsys.readouterr().err
    assert not target.exists()

    assert merge(out, "--role", "actor", "--step", "3", "-o", target) == 0
    assert "actor, step 3, cycle 0, ranks 0-1" in capsys.readouterr().out
    assert load(target)["policy_engine_merge"]["steps"] == [3]


def test_cycles_reruns_and_colocated_roles_are_windows_too(
        tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "out"
    for start, cycle in ((100.0, 0), (200.0, 1), (300.0, 1)):  # cycle 1 captured twice
        for rank in (0, 1):
            name = f"c{cycle}_{start:.0f}_rank{rank}.pt.trace.json"
            write_trace(out / name, cpu_events(rank + 5, 10.0))
            record(out, rank, name, cycle=cycle, start=start, roles=["actor", "ref"])
    target = tmp_path / "m.json"
    assert merge(out, "--step", "2", "-o", target) == 2
    err = capsys.readouterr().err
    assert "3 capture windows of actor+ref match" in err
    assert "step 2, cycle 1: ranks 0-1\n  step 2, cycle 1, capture 2: ranks 0-1" in err
    assert merge(out, "--role", "ref", "--cycle", "1", "--capture", "2", "-o", target) == 0
    trace = load(target)
    assert trace["policy_engine_merge"]["traces"] == [
        "c1_300_rank0.pt.trace.json", "c1_300_rank1.pt.trace.json"]
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"]
    assert names == ["rank 0 (actor+ref, dp=0 tp=0)", "rank 1 (actor+ref, dp=1 tp=0)"]
    assert merge(out, "--cycle", "0", "-o", tmp_path / "no" / "m.json") == 2
    assert "no/m.json: cannot write: No such file or directory" in capsys.readouterr().err


def test_other_files_of_the_window_are_skipped_with_a_reason(
        tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "out"
    two_ranks(out)
    record(out, 0, "t_actor_step2_rank0.pickle", backend="memory")
    record(out, 2, None, status="failed", error="RuntimeError: kineto")
    record(out, 3, "gone.pt.trace.json.gz")
    target = tmp_path / "m.json"
    assert merge(out, "-o", target) == 0
    err = capsys.readouterr().err
    assert "skipped t_actor_step2_rank0.pickle (rank 0): backend memory" in err
    assert "skipped (no file) (rank 2): failed, no file: RuntimeError: kineto" in err
    assert "skipped gone.pt.trace.json.gz (rank 3): missing" in err
    assert sorted(by_pid(load(target))) == [1, 2]


def test_no_manifests_or_no_folder_is_a_usage_error(tmp_path: Path, capsys: Any) -> None:
    assert merge(tmp_path, "-o", tmp_path / "m.json") == 2
    assert "no manifests under" in capsys.readouterr().err
    assert merge(tmp_path / "nope", "-o", tmp_path / "m.json") == 2
    assert "is not a folder" in capsys.readouterr().err


# -- bad traces, and the output file -----------------------------------------------------

def _cut_gzip(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _cut_json(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[: text.index('"update_actor"') + 5])


@pytest.mark.parametrize(("spoil", "why"), [
    (lambda p: p.write_text("hello"), "not a Chrome trace: it starts with 'h'"),
    (lambda p: p.write_text('{"traceEvents": [{"ph": "X"} {"ph": "X"}]}'),
     "not valid JSON: expected ',' or ']' at character 29"),
    (lambda p: p.write_text('{"schemaVersion": 1}'),
     "not a Chrome trace: it has no traceEvents"),
    (lambda p: p.write_text('{"traceEvents": [{"ph": x}]}'), "not valid JSON: Expecting value"),
    (_cut_json, "truncated: the file ends inside event 5 of traceEvents"),
    (lambda p: p.write_bytes(b'{"traceEvents": ["\xff"]}'), "not UTF-8 text: byte 0xff"),
])
def test_a_bad_trace_is_named_and_nothing_is_written(tmp_path: Path, capsys: Any,
                                                     spoil: Any, why: str) -> None:
    out = tmp_path / "out"
    two_ranks(out, gz=False)
    spoil(out / "t_actor_step2_rank1.pt.trace.json")
    target = tmp_path / "m.json.gz"
    assert merge(out, "-o", target) == 1
    err = capsys.readouterr().err
    assert f"error: t_actor_step2_rank1.pt.trace.json: {why}" in err
    assert os.listdir(tmp_path) == ["out"]  # no output, no temporary file


def test_a_truncated_gzip_trace_is_named(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "out"
    two_ranks(out)
    _cut_gzip(out / "t_actor_step2_rank0.pt.trace.json.gz")
    assert merge(out, "-o", tmp_path / "m.json") == 1
    assert "t_actor_step2_rank0.pt.trace.json.gz: truncated" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["out"]


def test_output_is_never_overwritten_without_force(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "out"
    two_ranks(out)
    target = tmp_path / "m.json"
    target.write_text("keep me")
    assert merge(out, "-o", target) == 2
    assert "m.json exists (--force replaces it)" in capsys.readouterr().err
    assert target.read_text() == "keep me"
    assert merge(out, "-o", target, "--force") == 0
    assert len(by_pid(load(target))) == 2
    assert merge(out, "-o", tmp_path) == 2
    assert sorted(os.listdir(tmp_path)) == ["m.json", "out"]


# -- the streaming reader ----------------------------------------------------------------

def test_reader_agrees_with_json_across_every_chunk_boundary(
        tmp_path: Path, monkeypatch: Any) -> None:
    events = [{"ph": "X", "name": "naïve ✓ \"quoted\" \\", "ts": 12345678901.25, "dur": 7,
               "args": {"nested": [1, {"a": None}], "neg": -1e-5, "big": 2 ** 70}},
              {"ph": "i", "name": "€", "ts": 3, "pid": "Spans", "tid": ""}] * 3
    path = write_trace(tmp_path / "t.json", events, head={"trace_id": "x"}, base_last=True)
    want = json.loads(path.read_text())
    for chunk in (1, 2, 3, 7, 64):
        monkeypatch.setattr(chrome_trace, "_CHUNK", chunk)
        with TraceReader(str(path)) as reader:
            assert reader.header() == {"trace_id": "x"}
            assert list(reader.events()) == want["traceEvents"]
            assert reader.meta == {"trace_id": "x", "baseTimeNanoseconds": BASE}


def test_reader_takes_a_bare_array_and_refuses_nan(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text('[{"ph": "C", "ts": 1}, 3, ]')
    with TraceReader(str(path)) as reader:
        assert list(reader.events()) == [{"ph": "C", "ts": 1}]
        assert reader.not_objects == 1
    # Not JSON, and no viewer reads it: said where, not silently changed.
    path.write_text('[{"ph": "C", "ts": 1}, {"ph": "C", "args": {"v": Infinity}}]')
    with TraceReader(str(path)) as reader, pytest.raises(
            TraceError, match=r"^Infinity is not a JSON number in event 2 of traceEvents, at "
                              r"or after character 23$"):
        list(reader.events())


def test_reader_refuses_an_event_larger_than_the_limit(tmp_path: Path,
                                                       monkeypatch: Any) -> None:
    monkeypatch.setattr(chrome_trace, "MAX_VALUE", 1000)
    monkeypatch.setattr(chrome_trace, "_CHUNK", 100)
    path = write_trace(tmp_path / "t.json", [{"ph": "X", "name": "x" * 5000}])
    with TraceReader(str(path)) as reader, pytest.raises(TraceError, match="larger than"):
        list(reader.events())


def _big_trace(path: Path, size: int, pid: int) -> int:
    """A plain-JSON torch-like trace of about ``size`` bytes, written a line at a time."""
    count = 0
    with open(path, "w") as f:
        f.write(f'{{"schemaVersion": 1, "baseTimeNanoseconds": {BASE}, "traceEvents": [\n')
        while f.tell() < size:
            for _ in range(1000):
                f.write(("" if not count else ",\n") + (
                    f'{{"ph": "X", "cat": "cpu_op", "name": "aten::op_{count % 97}", '
                    f'"pid": {pid}, "tid": {pid + count % 4}, "ts": {1000 + count}.25, '
                    f'"dur": 0.5, "args": {{"External id": {count}, "Sequence number": '
                    f'{count * 3}, "Input Dims": [[{count % 128}, 64], [64, 64]], '
                    '"Input type": ["float", "float"]}}'))
                count += 1
        f.write("\n]}\n")
    return count


_PEAK = """
import resource, sys
from policy_engine.cli.main import main
code = main(sys.argv[1:])
print("peak", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def _merge_peak(out: Path, target: Path) -> tuple[int, str]:
    """Merge in a fresh process: its peak resident memory (bytes) and its output."""
    done = subprocess.run([sys.executable, "-c", _PEAK, "merge", str(out), "-o", str(target)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return int(done.stderr.split("peak ")[-1]) * 1024, done.stdout


def test_a_large_trace_is_merged_in_bounded_memory(tmp_path: Path) -> None:
    small = tmp_path / "small"
    write_trace(small / "small.pt.trace.json", cpu_events(88, 10.0))
    record(small, 1, "small.pt.trace.json")
    baseline, _ = _merge_peak(small, tmp_path / "small.json.gz")

    big = tmp_path / "big"
    big.mkdir()
    size = 80 << 20
    count = _big_trace(big / "big.pt.trace.json", size, pid=77)
    record(big, 0, "big.pt.trace.json")
    write_trace(big / "small.pt.trace.json", cpu_events(88, 10.0), base=BASE + 1000)
    record(big, 1, "small.pt.trace.json")
    target = tmp_path / "m.pt.trace.json.gz"
    peak, said = _merge_peak(big, target)
    # json.load would hold ~10x the file; the stream holds a chunk and an event.
    assert peak - baseline < 24 << 20, f"{(peak - baseline) >> 20} MiB more for a large trace"
    # rank 0: its events, its name and place, 4 threads named and placed; rank 1: 3
    # events (torch's names held back), its name and place, 2 threads named and placed.
    assert f"(2 traces, {count + 2 + 4 * 2 + 3 + 2 + 2 * 2} events)" in said
    with TraceReader(str(target)) as reader:  # whole, read back as a stream
        ranks = {0: 0, 1: 0}
        for event in reader.events():
            if event.get("cat") == "cpu_op":
                ranks[event["pid"] - 1] += 1
    assert ranks == {0: count, 1: 1}


# -- real captures -----------------------------------------------------------------------

@pytest.mark.slow
def test_real_torch_captures_of_two_ranks_merge(tmp_path: Path) -> None:
    import torch

    from policy_engine import Topology, apply_policy
    from policy_engine.runtime.process import state

    class Worker:
        def __init__(self) -> None:
            self.model = torch.nn.Linear(8, 8)

        def update_actor(self) -> torch.Tensor:
            return self.model(torch.randn(4, 8)).sum()

    for rank in (0, 1):  # one process plays both ranks, one after the other
        policy = {"version": 1, "prefix": "t", "output_dir": str(tmp_path / "out" / f"r{rank}"),
                  "mesh": {"dp": 2}, "roles": {"actor": {
                      "enabled": True, "backend": "torch", "ranks": "all", "steps": [2],
                      "regions": ["update_actor"], "torch": {"activities": ["cpu"]}}}}
        worker = Worker()
        prof = apply_policy(worker, "actor", policy, Topology(rank=rank, world=2))
        for step in (1, 2, 3):
            with prof.training_step(step):
                worker.update_actor()
                prof.step()
        prof.close()
        state.reset()
    target = tmp_path / "merged.pt.trace.json.gz"
    assert main(["merge", str(tmp_path / "out"), "-o", str(target)]) == 0
    trace = load(target)
    procs = by_pid(trace)
    assert sorted(procs) == [1, 2]
    for rank in (0, 1):
        events = procs[rank + 1]
        (name,) = meta(events, "process_name")
        assert name["args"]["name"] == f"rank {rank} (actor, dp={rank})"
        assert name["args"]["metadata"]["policy_engine"]["rank"] == rank
        names = {e.get("name") for e in events}
        assert "update_actor" in names and any(str(n).startswith("aten::") for n in names)
    assert "baseTimeNanoseconds" in trace


def test_merge_never_writes_over_one_of_its_inputs(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    two_ranks(out)
    first = out / "t_actor_step2_rank0.pt.trace.json.gz"
    before = first.read_bytes()
    assert main(["merge", str(out), "--role", "actor", "--step", "2", "-o", str(first),
                 "--force"]) == 2
    assert "is one of the traces to merge" in capsys.readouterr().err
    assert first.read_bytes() == before


# -- bounded like the other readers ------------------------------------------------------

def _gzip_bomb(path: Path, gigabytes: int, honest: bool) -> None:
    """A trace gzip of a few MB that inflates to ``gigabytes`` GiB of blanks inside
    traceEvents: one compressed MiB repeated (blocks after a full flush stand alone). Its
    trailer says its size (modulo 4 GiB), or lies (0)."""
    pack = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = pack.compress(b'{"traceEvents": [') + pack.flush(zlib.Z_FULL_FLUSH)
    blanks = pack.compress(b" " * (1 << 20)) + pack.flush(zlib.Z_FULL_FLUSH)
    with open(path, "wb") as f:
        f.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + head)
        for _ in range(gigabytes << 10):
            f.write(blanks)
        f.write(pack.compress(b"]}") + pack.flush())
        size = ((gigabytes << 30) + 19) & 0xFFFFFFFF if honest else 0
        f.write(struct.pack("<II", 0, size))


@pytest.mark.slow
@pytest.mark.parametrize("honest", [True, False])
def test_merge_refuses_a_gzip_bomb_before_inflating_it(tmp_path: Path, honest: bool) -> None:
    out = tmp_path / "out"
    out.mkdir()
    _gzip_bomb(out / "bomb.pt.trace.json.gz", 10, honest)
    assert (out / "bomb.pt.trace.json.gz").stat().st_size < 12 << 20
    record(out, 0, "bomb.pt.trace.json.gz")
    # 10 GiB inflated would take minutes; the refusal (the trailer, or 100 times the size
    # on disk) says where it stopped. The timeout only ends a hang.
    done = subprocess.run([sys.executable, "-m", "policy_engine", "merge", str(out), "-o",
                           str(tmp_path / "m.json")], capture_output=True, text=True,
                          timeout=300, env=child_env())
    assert done.returncode == 1
    why = ("its gzip trailer says it inflates to 2,147,483,667 bytes, over --max-trace-mb "
           "2048") if honest else "it inflates to more than 100 times its size on disk " \
        "(a gzip bomb?)"
    assert done.stderr.strip() == f"policy-engine merge: error: bomb.pt.trace.json.gz: {why}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_merge_holds_each_trace_to_its_bounds(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "out"
    write_trace(out / "a.pt.trace.json", cpu_events(7, 10.0) * 10)
    record(out, 0, "a.pt.trace.json")
    assert merge(out, "-o", tmp_path / "m.json", "--max-events", "59") == 1
    assert capsys.readouterr().err.strip() == (
        "policy-engine merge: error: a.pt.trace.json: it holds more than 59 events (the "
        "most read of one trace)")
    _big_trace(out / "b.pt.trace.json", 3 << 20, pid=9)
    record(out, 0, "b.pt.trace.json", steps=(3,))
    assert merge(out, "-o", tmp_path / "m.json", "--step", "3", "--max-trace-mb", "2") == 1
    assert capsys.readouterr().err.strip() == (
        "policy-engine merge: error: b.pt.trace.json: it is more than 2 MiB of text (the "
        "most read of one trace)")
    assert merge(out, "-o", tmp_path / "m.json", "--step", "2", "--max-events", "60") == 0
    assert "rank 0 (1 trace, " in capsys.readouterr().out
    assert sum(1 for e in load(tmp_path / "m.json")["traceEvents"] if e["ph"] == "X") == 20


def _ctrl_c_as_in_a_terminal() -> None:
    """SIGINT as a terminal leaves it: a test run started in the background of a shell
    ignores it, and a child Python that starts with it ignored never sees Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _merge_paused_midway(out: Path, target: Path) -> subprocess.Popen[str]:
    """``merge`` of ``out`` into ``target``, paused (SIGSTOP) while its temporary file is
    there and the output is not yet. A merge that got past that point before the pause
    reached it (a small gzip output is written in one go at its end) is run again; what it
    wrote is removed first."""
    for _ in range(10):
        proc = subprocess.Popen([sys.executable, "-m", "policy_engine", "merge", str(out),
                                 "-o", str(target)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=child_env(),
                                preexec_fn=_ctrl_c_as_in_a_terminal)
        deadline = time.monotonic() + 120
        while not any(p != target for p in target.parent.iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline, "no temporary file seen"
            time.sleep(0.005)
        proc.send_signal(signal.SIGSTOP)
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
        if os.WIFSTOPPED(status) and not target.exists() \
                and any(p != target for p in target.parent.iterdir()):
            return proc
        if os.WIFSTOPPED(status):
            proc.send_signal(signal.SIGCONT)
        proc.communicate()
        for p in target.parent.iterdir():
            p.unlink()
    raise AssertionError("the merge got past its temporary file each time before the pause")


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_merge_stopped_midway_leaves_nothing_beside_its_output(tmp_path: Path,
                                                              stop: int) -> None:
    out = tmp_path / "out"
    out.mkdir()
    _big_trace(out / "big.pt.trace.json", 40 << 20, pid=5)
    record(out, 0, "big.pt.trace.json")
    target = tmp_path / "merged" / "m.pt.trace.json.gz"
    target.parent.mkdir()
    proc = _merge_paused_midway(out, target)
    proc.send_signal(stop)  # pending while it is paused: it lands midway, on any machine
    proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=60)
    # SIGTERM ends it as SIGTERM does; Ctrl-C is the command's "interrupted" (130)
    assert proc.returncode == (-signal.SIGTERM if stop == signal.SIGTERM else 130), err
    assert list(target.parent.iterdir()) == []
