"""One trace's collective calls (analysis/collectives.py) and their record
(analysis/collective_form.py): HTA's NCCL trace with every kernel's call, its bytes and its
bus bandwidth held to NCCL-tests' formulas computed here on their own; GPU-, NPU- and
gloo-shaped traces; the cap and its folding; a record read back from a manifest, forged."""

from __future__ import annotations

import gzip
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from policy_engine.analysis.chrome_trace import TraceReader
from policy_engine.analysis.collective_form import (
    MAX_CALLS,
    FormError,
    bus_factor,
    normal_name,
    problem,
    rank_runs,
    read,
    runs_ranks,
)
from policy_engine.analysis.collectives import Collectives
from policy_engine.analysis.manifests import MAX_LINE_BYTES
from policy_engine.analysis.matching import Matcher

EXTERNAL = Path(__file__).parent / "data" / "external"
HTA_NCCL = EXTERNAL / "hta" / "nccl_parser_config" / "nccl_data.json.gz"
ASCEND = EXTERNAL / "ascend" / "trace_view.json"


def extract(path: Path) -> dict[str, Any]:
    found = Collectives()
    with TraceReader(str(path)) as reader:
        for event in reader.events():
            found.event(event)
        meta = reader.meta
    return found.result(meta)


def write(tmp_path: Path, events: list[dict[str, Any]], name: str = "t.json",
          **meta: Any) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events, **meta}))
    return path


def rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's calls as one dict each, labels resolved, times absolute."""
    calls, base = record["calls"], record["base_us"]
    out = []
    for i in range(len(calls["start"])):
        g = record["groups"][calls["group"][i]]
        issue = calls["issue"][i]
        out.append({"group": g["name"], "ranks": runs_ranks(g["ranks"] or []),
                    "number": calls["number"][i], "kind": record["names"][calls["name"][i]],
                    "dtype": record["dtypes"][calls["dtype"][i]], "bytes": calls["bytes"][i],
                    "issue": None if issue is None else issue + base,
                    "start": calls["start"][i] + base, "end": calls["end"][i] + base})
    return out


# -- HTA's NCCL trace -------------------------------------------------------------------

def _hta_kernels() -> tuple[list[dict[str, Any]], dict[int, float]]:
    """The trace's NCCL kernels that carry a collective, and record_param_comms' start by
    External id, read here with json alone."""
    with gzip.open(HTA_NCCL) as f:
        events = json.load(f)["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"
                      and "Collective name" in e.get("args", {})), key=lambda e: e["ts"])
    issued = {e["args"]["External id"]: e["ts"] for e in events
              if e.get("name") == "record_param_comms"}
    return kernels, issued


def test_every_nccl_kernel_of_htas_trace_is_a_call_with_its_group_kind_and_bytes() -> None:
    kernels, issued = _hta_kernels()
    assert len(kernels) == 21  # 15 all-reduces and 6 broadcasts
    record = extract(HTA_NCCL)
    assert (record["source"], record["clock"], record["numbered"]) == \
        ("nccl", "device", "order")
    assert record["total"] == 21 and not record["capped"] and record["problems"] == []
    element = {"Float": 4, "Long": 8}
    got = rows(record)
    assert [r["number"] for r in got] == list(range(1, 22))  # one group, in order
    for call, k in zip(got, kernels, strict=True):
        args = k["args"]
        assert call["group"] == args["Process Group Name"] == "0"
        assert call["ranks"] == [0, 1]
        assert call["kind"] == {"allreduce": "allreduce",
                                "broadcast": "broadcast"}[args["Collective name"]]
        assert call["bytes"] == max(args["In msg nelems"], args["Out msg nelems"]) \
            * element[args["dtype"]]
        assert call["start"] == pytest.approx(k["ts"], abs=1e-3)
        assert call["end"] == pytest.approx(k["ts"] + k["dur"], abs=1e-3)
        assert call["issue"] == pytest.approx(issued[args["External id"]], abs=1e-3)


def test_bus_bandwidth_of_htas_calls_is_nccl_tests_formula() -> None:
    """The trace is rank 0 of a 2-rank job; read as both ranks (each arriving when its
    kernel starts), every call's transfer is its kernel's duration, and its bus bandwidth
    NCCL-tests' (doc/PERFORMANCE.md): algbw = S / t, busbw = algbw x 2(n-1)/n for an
    all-reduce, x 1 for a broadcast."""
    kernels, _ = _hta_kernels()
    table = read(json.loads(json.dumps(extract(HTA_NCCL))))
    matcher = Matcher()
    matcher.add(0, table)
    matcher.add(1, table)
    calls = matcher.calls()
    assert len(calls["number"]) == 21
    element = {"Float": 4, "Long": 8}
    n = 2
    factor = {"allreduce": 2 * (n - 1) / n, "broadcast": 1.0}
    for i, k in enumerate(kernels):
        args = k["args"]
        size = args["In msg nelems"] * element[args["dtype"]]
        algbw = size / (k["dur"] * 1e-6) / 1e9  # bytes per second, in GB/s
        busbw = algbw * factor[args["Collective name"]]
        assert calls["bytes"][i] == size
        assert calls["transfer_us"][i] == pytest.approx(k["dur"], abs=2e-3)
        assert calls["algbw_gbps"][i] == pytest.approx(algbw, rel=1e-5)
        assert calls["busbw_gbps"][i] == pytest.approx(busbw, rel=1e-5)
    group = matcher.result()["groups"][0]
    assert group["name"] == "0" and group["calls"] == 21


def test_record_param_comms_joined_to_bare_kernels_by_external_id(tmp_path: Path) -> None:
    """Older torch: the kernels carry no collective args; record_param_comms names them."""
    with gzip.open(HTA_NCCL) as f:
        trace = json.load(f)
    for e in trace["traceEvents"]:
        if e.get("cat") == "kernel" and "Collective name" in e.get("args", {}):
            e["args"] = {"External id": e["args"]["External id"]}
    path = tmp_path / "bare.json"
    path.write_text(json.dumps(trace))
    record = extract(path)
    assert record["source"] == "record_param_comms"
    assert [(r["kind"], r["bytes"]) for r in rows(record)] == \
        [(r["kind"], r["bytes"]) for r in rows(extract(HTA_NCCL))]


# -- GPU, NPU and CPU shapes --------------------------------------------------------------

def _kernel(ts: float, dur: float, ext: int, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL(...)",
            "pid": 0, "tid": 7, "ts": ts, "dur": dur, "args": {"External id": ext, **args}}


def test_gpu_shaped_calls_numbered_by_torchs_sequence_numbers(tmp_path: Path) -> None:
    meta = {"Process Group Name": "3", "Process Group Description": "mesh_dp",
            "Process Group Ranks": "[1, 3, 5, 7]", "Group size": 4, "dtype": "BFloat16",
            "In msg nelems": 1024, "Out msg nelems": 4096}
    events = []
    for i, seq in enumerate((17, 18, 19)):
        events.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1,
                       "tid": 1, "ts": 100.0 * i, "dur": 5.0,
                       "args": {"External id": 50 + i, "Collective name": "_allgather_base",
                                "Seq": seq, **meta}})
        events.append(_kernel(100.0 * i + 30, 40.0, 50 + i, Seq=seq,
                              **{"Collective name": "_allgather_base", **meta}))
    record = extract(write(tmp_path, events))
    assert record["numbered"] == "seq"
    got = rows(record)
    assert [r["number"] for r in got] == [17, 18, 19]
    assert {(r["group"], tuple(r["ranks"]), r["kind"], r["bytes"]) for r in got} == \
        {("3", (1, 3, 5, 7), "allgather", 4096 * 2)}  # the gathered buffer, bf16
    assert record["groups"][0]["ranks"] == [[1, 2, 4]]
    assert [r["issue"] for r in got] == [0.0, 100.0, 200.0]


def test_gloo_calls_beside_nccl_kernels_are_said_not_listed(tmp_path: Path) -> None:
    meta = {"Process Group Name": "0", "Process Group Ranks": "[0, 1]", "Group size": 2,
            "dtype": "Float", "Collective name": "allreduce", "In msg nelems": 4,
            "Out msg nelems": 4}
    record = extract(write(tmp_path, [_kernel(0.0, 5.0, 1, **meta),
                                      _gloo(10.0, 5.0, 31, "gloo:barrier")]))
    assert record["source"] == "nccl" and len(record["calls"]["start"]) == 1
    assert record["problems"] == ["1 gloo calls beside the device's are not listed: the "
                                  "record holds one backend's calls"]


def test_npu_shaped_hccl_tasks_are_calls_of_their_threads_group(tmp_path: Path) -> None:
    group = "10.0.0.1%enp_60000_0_1712"
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 900, "tid": 0, "args": {"name": "HCCL"}},
        {"ph": "M", "name": "thread_name", "pid": 900, "tid": 1,
         "args": {"name": f"Group {group} Communication"}},
        {"ph": "M", "name": "thread_name", "pid": 900, "tid": 2,
         "args": {"name": f"Group {group} Plane 0"}},
    ]
    for i, (op, count, dtype) in enumerate((("hcom_allReduce__184_0_1", 2048, "FP16"),
                                            ("hcom_allGather__184_1_1", 512, "FP32"),
                                            ("hcom_send__184_2_1", 8, "INT8"))):
        events.append({"ph": "X", "name": op, "pid": 900, "tid": 1, "ts": 1000.0 * i,
                       "dur": 300.0, "args": {"count": count, "data_type": dtype}})
        events.append({"ph": "X", "name": "Notify_Wait", "pid": 900, "tid": 2,
                       "ts": 1000.0 * i, "dur": 100.0, "args": {}})
    record = extract(write(tmp_path, events))
    assert (record["source"], record["clock"], record["p2p"]) == ("hccl", "device", 1)
    assert [(r["group"], r["number"], r["kind"], r["bytes"]) for r in rows(record)] == \
        [(group, 1, "allreduce", 4096), (group, 2, "allgather", 2048)]


def test_the_ascend_trace_holds_no_collective_call() -> None:
    record = extract(ASCEND)  # one rank, no HCCL task: read without a problem
    assert record["total"] == 0 and record["calls"]["start"] == [] and not record["problems"]


def _gloo(ts: float, dur: float, tid: int, op: str = "gloo:all_reduce") -> dict[str, Any]:
    return {"ph": "X", "cat": "user_annotation", "name": op, "pid": 1, "tid": tid,
            "ts": ts, "dur": dur, "args": {}}


def _c10d(ts: float, op: str = "c10d::allreduce_") -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": ts,
            "dur": 20.0, "args": {"Sequence number": 0}}


def test_gloo_without_notes_numbers_worker_events_in_an_unknown_group(
        tmp_path: Path) -> None:
    events = [_c10d(0.0), _gloo(10.0, 500.0, 31), _c10d(600.0, "c10d::broadcast_"),
              _gloo(605.0, 50.0, 32, "gloo:broadcast")]
    record = extract(write(tmp_path, events))
    assert record["source"] == "c10d" and record["numbered"] == "order"
    got = rows(record)
    assert [(r["group"], r["number"], r["kind"], r["issue"], r["start"]) for r in got] == \
        [(None, 1, "allreduce", 0.0, 10.0), (None, 2, "broadcast", 600.0, 605.0)]


def _notes(base_ns: int, calls: list[tuple[str, int, str, int, float]]) -> dict[str, Any]:
    """Trace metadata as a torch capture writes it: the runtime's notes of its calls,
    torch's process groups."""
    return {"baseTimeNanoseconds": base_ns,
            "distributedInfo": {"pg_config": [
                {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [0, 1, 2, 3]},
                {"pg_name": "1", "pg_desc": "tp", "pg_size": 2, "ranks": [0, 1]}]},
            "policy_engine": {"collectives": {"from": "flight_recorder", "calls": [
                [g, {"0": "default_pg", "1": "tp"}[g], seq, op, size,
                 "Float", base_ns + int(us * 1000)] for g, seq, op, size, us in calls]}}}


def test_gloo_with_notes_pairs_worker_events_with_their_groups_calls(
        tmp_path: Path) -> None:
    """Two groups issue all-reduces of the same kind back to back; each group's worker
    threads (31, 32 for the world; 41, 42 for tp) take its calls in issue order, and a
    thread once paired keeps its group."""
    base = 1_700_000_000_000_000_000
    notes = _notes(base, [("0", 7, "gloo:all_reduce", 64, 100.0),
                          ("1", 3, "gloo:all_reduce", 32, 110.0),
                          ("0", 8, "gloo:all_reduce", 64, 900.0),
                          ("1", 4, "gloo:all_reduce", 32, 905.0),
                          ("0", 9, "gloo:broadcast", 64, 2000.0)])
    events = [_c10d(95.0), _c10d(105.0), _c10d(895.0), _c10d(900.0),
              _c10d(1995.0, "c10d::broadcast_"),
              _gloo(104.0, 400.0, 31), _gloo(112.0, 300.0, 41),
              # the tp call's thread wakes first this time: its thread decides
              _gloo(907.0, 200.0, 42), _gloo(908.0, 200.0, 32), _gloo(910.0, 5.0, 41),
              _gloo(2003.0, 50.0, 31, "gloo:broadcast")]
    events[-2]["name"] = "gloo:all_reduce"
    record = extract(write(tmp_path, events, **notes))
    got = rows(record)
    assert record["source"] == "gloo" and record["numbered"] == "seq"
    paired = [(r["group"], r["number"], r["bytes"], r["start"]) for r in got]
    assert ("0", 7, 64, 104.0) in paired and ("1", 3, 32, 112.0) in paired
    assert ("1", 4, 32, 907.0) in paired and ("0", 8, 64, 908.0) in paired
    assert ("0", 9, 64, 2003.0) in paired
    assert {r["group"]: r["ranks"] for r in got} == {"0": [0, 1, 2, 3], "1": [0, 1]}
    issue = {(r["group"], r["number"]): r["issue"] for r in got}
    assert issue[("0", 8)] == pytest.approx(900.0) and issue[("1", 4)] == pytest.approx(905.0)
    assert record["problems"] == ["1 gloo worker events matched no noted call: not listed"]


# -- bounds -------------------------------------------------------------------------------

def test_calls_past_the_cap_are_folded_with_counts_and_sums(tmp_path: Path) -> None:
    meta = {"Process Group Name": "0", "Process Group Ranks": "[0, 1]", "Group size": 2,
            "dtype": "Float", "Collective name": "allreduce"}
    extra = 50
    events = [_kernel(10.0 * i, 4.0, i, **{**meta, "In msg nelems": 1 + i % 2,
                                           "Out msg nelems": 1 + i % 2})
              for i in range(MAX_CALLS + extra)]
    record = extract(write(tmp_path, events))
    assert len(record["calls"]["start"]) == MAX_CALLS
    assert record["capped"] and record["total"] == MAX_CALLS + extra
    folded = {row[2]: row for row in record["folded"]}  # by bytes: 4 and 8
    assert sum(row[3] for row in folded.values()) == extra
    assert folded[4][3] == folded[8][3] == extra // 2
    assert folded[4][4] == pytest.approx(4.0 * extra / 2)
    # a full record fits a manifest line with room to spare for the rest of the summary
    assert len(json.dumps(record)) < MAX_LINE_BYTES // 3


def test_a_forged_million_calls_is_refused_by_its_length() -> None:
    n = 1_000_000
    forged = {"source": "nccl", "clock": "device", "numbered": "seq", "base_us": 0.0,
              "groups": [{"name": "0", "desc": "", "size": 2, "ranks": [[0, 1, 2]]}],
              "names": ["allreduce"], "dtypes": ["Float"],
              "calls": {k: [0] * n for k in ("group", "number", "name", "dtype", "bytes",
                                            "issue", "start", "end")},
              "folded": [], "total": n, "p2p": 0, "capped": False, "problems": []}
    began = time.perf_counter()
    said = problem(forged)
    assert time.perf_counter() - began < 5.0  # generous: the columns are never walked
    assert said is not None and "1,000,000 calls" in said and f"{MAX_CALLS:,}" in said


def _good() -> dict[str, Any]:
    return {"source": "gloo", "clock": "host", "numbered": "seq", "base_us": 1e12,
            "groups": [{"name": "0", "desc": "default_pg", "size": 2, "ranks": [[0, 1, 2]]}],
            "names": ["allreduce"], "dtypes": ["Float"],
            "calls": {"group": [0, 0], "number": [1, 2], "name": [0, 0], "dtype": [0, 0],
                      "bytes": [64, 64], "issue": [None, 5.0], "start": [1.0, 6.0],
                      "end": [2.0, 9.5]},
            "folded": [[0, 0, 64, 3, 7.5]], "total": 5, "p2p": 0, "capped": True,
            "problems": []}


@pytest.mark.parametrize(("where", "value", "said"), [
    (("calls", "bytes"), [64, -1], "bytes column"),
    (("calls", "number"), [1, 2.5], "number column"),
    (("calls", "group"), [0, 1], "group column"),
    (("calls", "start"), [1.0, "x"], "start column"),
    (("calls", "end"), [1.0], "end column is not a list of 2"),
    (("calls", "issue"), [None, 1e19], "issue column"),
    (("groups",), [{"name": "0", "desc": "", "size": 3, "ranks": [[0, 1, 2]]}],
     "do not number its size"),
    (("names",), ["x" * 500], "names"),
    (("clock",), "gpu", "known words"),
    (("folded",), [[0, 0, 64, -3, 1.0]], "folded row 0"),
    (("base_us",), float("inf"), "base_us"),
])
def test_a_record_read_back_says_what_is_wrong(where: tuple[str, ...], value: Any,
                                                said: str) -> None:
    record = _good()
    target = record
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    with pytest.raises(FormError, match=said):
        read(record)


def test_a_record_reads_back_as_written() -> None:
    table = read(_good())
    assert list(table.number) == [1, 2] and math.isnan(table.issue[0])
    assert table.base + table.end[1] == 1e12 + 9.5
    again = table.to_json()
    assert again == _good()


# -- the shared definitions ------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "kind"), [
    ("allreduce", "allreduce"), ("_allgather_base", "allgather"),
    ("all_gather_into_tensor_coalesced", "allgather"), ("reduce_scatter_tensor", "reducescatter"),
    ("gloo:all_reduce", "allreduce"), ("nccl:_reduce_scatter_base", "reducescatter"),
    ("c10d::alltoall_base_", "alltoall"), ("hcom_allReduce_", "allreduce"),
    ("hcom_receive_", "recv"), ("ncclDevKernel_SendRecv", "send"),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t", "broadcast"), ("gloo:barrier", "barrier"),
    ("c10d::reduce_", "reduce"), ("something", "something"),
])
def test_collective_names_are_nccl_tests_kinds(raw: str, kind: str) -> None:
    assert normal_name(raw) == kind


def test_bus_factors_are_nccl_tests() -> None:
    assert bus_factor("allreduce", 8) == pytest.approx(2 * 7 / 8)
    for kind in ("allgather", "reducescatter", "alltoall"):
        assert bus_factor(kind, 8) == pytest.approx(7 / 8)
    assert bus_factor("broadcast", 8) == bus_factor("reduce", 8) == 1.0
    assert bus_factor("barrier", 8) is None and bus_factor("allreduce", 1) is None


@pytest.mark.parametrize("ranks", [[0, 1, 2, 3], [3, 11, 19], [0, 2, 4, 6, 1, 3], [5],
                                   [0, 1, 5, 6, 7, 20]])
def test_ranks_as_runs_round_trip(ranks: list[int]) -> None:
    runs = rank_runs(sorted(ranks))
    assert runs is not None and runs_ranks(runs) == sorted(ranks)
    assert rank_runs(list(range(0, 80_000, 8))) == [[0, 8, 10_000]]
