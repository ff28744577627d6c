"""One rank's collective calls as its summary holds them: the record, its checks, and the
definitions the extractor (collectives.py) and the matching (matching.py) share.

The record (``summary["collectives"]``, JSON-ready, columnar so that a rank's thousands of
calls cost a few numbers each, never an object each)::

    {"source": "nccl" | "record_param_comms" | "gloo" | "hccl" | "c10d" | null,
     "clock": "device" | "host",          # what start and end measure
     "numbered": "seq" | "order",         # where each call's number comes from
     "base_us": 5585816803871.2,          # the trace's clock: times are µs after it
     "groups": [{"name": "0", "desc": "default_pg", "size": 4,
                 "ranks": [[0, 1, 4]]}],  # runs [first, stride, count]; null: unknown
     "names": ["allreduce"], "dtypes": ["Float"],
     "calls": {"group": [0], "number": [1], "name": [0], "dtype": [0], "bytes": [4000],
               "issue": [12.5], "start": [20.0], "end": [95.5]},   # issue may be null
     "folded": [[0, 0, 4000, 17, 1234.5]],  # past the cap: group, name, bytes, calls, µs
     "total": 4113, "p2p": 0, "capped": true, "problems": ["..."]}

A group whose ``name`` is null is unknown (a gloo trace recorded without the runtime's
notes): its calls are numbered in the order they ran. ``bytes`` is the larger of the
call's input and output sizes (elements times the element size), which is the size
NCCL-tests' formulas take: an all-gather's whole gathered buffer, a reduce-scatter's
whole input. Every figure read back from a manifest is untrusted: :func:`read` checks
types and bounds before anything is built, and refuses a record past the limits below
without walking it.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Iterable, Sequence
from typing import Any, TypedDict

#: A summary lists at most this many calls one by one; the rest are folded per
#: (group, name, bytes). 4,096 calls take about 250 KB of JSON, well inside the 1 MiB a
#: manifest line may hold (analysis/manifests.py) with the rest of the summary.
MAX_CALLS = 4096
MAX_GROUPS = 1024
MAX_RUNS = 64  # runs of ranks per group; a group needing more keeps only its size
MAX_LABELS = 64  # distinct collective names, and distinct dtypes
MAX_FOLDED = 512
MAX_TEXT = 200  # characters of a name, a description, a problem
MAX_PROBLEMS = 8
MAX_RANK = 1 << 24  # ranks, group sizes
MAX_NUMBER = 1 << 53  # call numbers, byte counts
_HUGE = 1e18  # microseconds: beyond it a timestamp is garbage

#: Bytes per element of the dtype names torch (record_param_comms, the flight recorder),
#: kineto's ``Input type`` and HCCL write, lower-cased.
DTYPE_BYTES: dict[str, int] = {
    **dict.fromkeys(("float", "float32", "fp32", "int", "int32", "uint32", "qint32",
                     "complexhalf", "complex32"), 4),
    **dict.fromkeys(("double", "float64", "fp64", "long", "int64", "long int", "uint64",
                     "complexfloat", "complex64"), 8),
    **dict.fromkeys(("half", "float16", "fp16", "bfloat16", "bf16", "bfp16", "short",
                     "int16", "uint16", "c10::half", "c10::bfloat16"), 2),
    **dict.fromkeys(("byte", "uint8", "char", "int8", "bool", "qint8", "quint8",
                     "unsigned char", "signed char", "float8_e4m3fn", "float8_e5m2",
                     "float8_e4m3fnuz", "float8_e5m2fnuz", "hif8"), 1),
    **dict.fromkeys(("complexdouble", "complex128"), 16),
}

#: The canonical kinds of collective, as NCCL-tests names its tests.
KINDS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce",
         "gather", "scatter", "barrier")
#: Point-to-point calls: counted, never listed (a send and its receive pair two ranks,
#: not a group, so they are not matched by group and number).
P2P = frozenset({"send", "recv"})
_STRIP = re.compile(r"^(c10d::|c10d_functional::|_c10d_functional::|gloo:|nccl:|hccl:|"
                    r"hcom_|nccldevkernel_|ncclkernel_|rccl)")
#: Kernel-name parts that follow the kind (ncclDevKernel_AllReduce_Sum_f32_RING_LL).
_KIND = re.compile(r"(allreduce|allgather|reducescatter|alltoall|broadcast|barrier|"
                   r"sendrecv|send|recv|receive|reduce|gather|scatter)")


def normal_name(raw: str) -> str:
    """The kind of collective a name says, as NCCL-tests names it (``allreduce``,
    ``allgather``, ``reducescatter``, ``alltoall``, ``broadcast``, ``reduce``, ``gather``,
    ``scatter``, ``barrier``; ``send``/``recv`` for point-to-point), from what torch,
    gloo, NCCL kernels and HCCL call it (``_allgather_base``, ``gloo:all_reduce``,
    ``ncclDevKernel_ReduceScatter_Sum_f32_RING_LL``, ``hcom_allReduce_``). A name
    naming none is returned lower-cased and cut to MAX_TEXT (its bus bandwidth is
    unknown)."""
    text = _STRIP.sub("", raw.lower()).replace("_", "")
    found = _KIND.search(text)
    if found is None:
        return text[:MAX_TEXT] or "unknown"
    kind = found.group(1)
    return {"sendrecv": "send", "receive": "recv"}.get(kind, kind)


def bus_factor(kind: str, size: int) -> float | None:
    """NCCL-tests' bus-bandwidth factor (doc/PERFORMANCE.md) for ``kind`` in a group of
    ``size`` ranks: busbw = algbw x factor. None where there is none (a barrier moves no
    data; an unknown kind; a group of one)."""
    if size < 2:
        return None
    n = float(size)
    if kind == "allreduce":
        return 2 * (n - 1) / n
    if kind in ("allgather", "reducescatter", "alltoall", "gather", "scatter"):
        return (n - 1) / n
    if kind in ("broadcast", "reduce", "send", "recv"):
        return 1.0
    return None


def dtype_bytes(name: str) -> int | None:
    return DTYPE_BYTES.get(name.strip().lower())


# -- ranks as runs --------------------------------------------------------------------

def rank_runs(ranks: Sequence[int]) -> list[list[int]] | None:
    """``ranks`` as runs ``[first, stride, count]`` (``[0, 2, 4, 6, 1]`` -> ``[[0, 2, 4],
    [1, 1, 1]]``): a data-parallel group of 10,000 ranks is one run. None past MAX_RUNS."""
    runs: list[list[int]] = []
    i = 0
    while i < len(ranks):
        if len(runs) >= MAX_RUNS:
            return None
        first = ranks[i]
        if i + 1 == len(ranks):
            runs.append([first, 1, 1])
            break
        stride = ranks[i + 1] - first
        j = i + 1
        while j + 1 < len(ranks) and ranks[j + 1] - ranks[j] == stride:
            j += 1
        if stride <= 0:  # not increasing: one rank per run
            runs.append([first, 1, 1])
            i += 1
            continue
        runs.append([first, stride, j - i + 1])
        i = j + 1
    return runs


def runs_ranks(runs: Iterable[Sequence[int]]) -> list[int]:
    return [first + k * stride for first, stride, count in runs for k in range(count)]


# -- the record ------------------------------------------------------------------------

class GroupRecord(TypedDict):
    """A process group in the record (:meth:`Group.to_json`)."""

    name: str | None  # None: unknown
    desc: str
    size: int | None
    ranks: list[list[int]] | None  # runs [first, stride, count]; None: unknown


class CallColumns(TypedDict):
    """The record's calls, a list per figure (made by :meth:`CallTable.to_json`)."""

    group: list[int]  # index into ``groups``
    number: list[int]
    name: list[int]  # index into ``names``
    dtype: list[int]  # index into ``dtypes``
    bytes: list[int]
    issue: list[float | None]  # µs after base_us, as start and end; None: unknown
    start: list[float]
    end: list[float]


class CollectiveRecord(TypedDict):
    """One rank's collective calls as its summary holds them, made by :meth:`CallTable.to_json`."""

    source: str | None
    clock: str  # what start and end measure: "device" or "host"
    numbered: str  # where each call's number comes from: "seq" or "order"
    base_us: float
    groups: list[GroupRecord]
    names: list[str]
    dtypes: list[str]
    calls: CallColumns
    folded: list[list[float]]  # past the cap: [group, name, bytes, calls, µs]
    total: int
    p2p: int
    capped: bool
    problems: list[str]


# -- the record in memory ---------------------------------------------------------------

class Group:
    """A process group as a rank saw it: name (None: unknown), description, size and
    member ranks as runs (None: unknown)."""

    __slots__ = ("desc", "name", "runs", "size")

    def __init__(self, name: str | None, desc: str = "", size: int | None = None,
                 runs: list[list[int]] | None = None) -> None:
        self.name, self.desc, self.size, self.runs = name, desc, size, runs

    def to_json(self) -> GroupRecord:
        return {"name": self.name, "desc": self.desc, "size": self.size, "ranks": self.runs}


class CallTable:
    """One rank's calls, column by column: times in µs after ``base`` (the trace's clock),
    an unknown issue time NaN."""

    __slots__ = ("base", "bytes", "capped", "clock", "dtype", "dtypes", "end", "folded", "group",
                 "groups", "issue", "name", "names", "number", "numbered", "p2p",
                 "problems", "source", "start", "total")

    def __init__(self) -> None:
        self.groups: list[Group] = []
        self.names: list[str] = []
        self.dtypes: list[str] = []
        self.group, self.number, self.name = array("q"), array("q"), array("q")
        self.dtype, self.bytes = array("q"), array("q")
        self.issue, self.start, self.end = array("d"), array("d"), array("d")
        self.base = 0.0
        self.folded: list[list[Any]] = []
        self.source: str | None = None
        self.clock = "host"
        self.numbered = "order"
        self.total = 0
        self.p2p = 0
        self.capped = False
        self.problems: list[str] = []

    def __len__(self) -> int:
        return len(self.start)

    def rebase(self) -> None:
        """Times after the earliest of them, to the nanosecond (the record's form)."""
        known = [t for t in self.issue if not math.isnan(t)]
        low = min(min(self.start, default=0.0), min(known, default=math.inf))
        base = round(self.base + low, 3)
        shift = self.base - base
        for name in ("issue", "start", "end"):
            setattr(self, name, array("d", (round(t + shift, 3)
                                            for t in getattr(self, name))))
        self.base = base

    def to_json(self) -> CollectiveRecord:
        """The record (module docstring)."""
        return {
            "source": self.source, "clock": self.clock, "numbered": self.numbered,
            "base_us": self.base,
            "groups": [g.to_json() for g in self.groups],
            "names": list(self.names), "dtypes": list(self.dtypes),
            "calls": {"group": list(self.group), "number": list(self.number),
                      "name": list(self.name), "dtype": list(self.dtype),
                      "bytes": list(self.bytes),
                      "issue": [None if math.isnan(t) else t for t in self.issue],
                      "start": list(self.start), "end": list(self.end)},
            "folded": [list(row) for row in self.folded],
            "total": self.total, "p2p": self.p2p, "capped": self.capped,
            "problems": self.problems[:MAX_PROBLEMS],
        }


# -- the record read back ---------------------------------------------------------------

class FormError(ValueError):
    """A record that is not what :meth:`CallTable.to_json` writes; the message says what."""


_FLOAT = (int, float)


def _ints(col: Any, what: str, hi: int, n: int) -> array[int]:
    """A column of whole numbers in [0, hi) (JSON booleans read as 0 and 1)."""
    if not isinstance(col, list) or len(col) != n:
        raise FormError(f"its calls' {what} column is not a list of {n} entries")
    try:
        out = array("q", col)  # refuses anything but integers, in C
    except (TypeError, OverflowError):
        out = None
    if out is None or (n and (min(out) < 0 or max(out) >= hi)):
        raise FormError(f"its calls' {what} column holds something other than whole "
                        f"numbers from 0 to {hi - 1}")
    return out


def _times(col: Any, what: str, n: int, *, nullable: bool = False) -> array[float]:
    """A column of times (µs), finite and below 10^18 in size; nulls read as NaN."""
    if not isinstance(col, list) or len(col) != n:
        raise FormError(f"its calls' {what} column is not a list of {n} entries")
    nulls = nullable and None in col
    if nulls:
        col = [math.nan if v is None else v for v in col]
    try:
        out = array("d", col)  # refuses anything but numbers, in C
    except TypeError:
        out = None
    known = [t for t in out if t == t] if out is not None and nulls else out
    if out is None or (known and not (math.isfinite(sum(known))
                                      and min(known) > -_HUGE and max(known) < _HUGE)):
        raise FormError(f"its calls' {what} column holds something other than times")
    return out


def _text(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= MAX_TEXT


def _count(v: Any, hi: int = MAX_NUMBER) -> bool:
    return type(v) is int and 0 <= v < hi


def _group(g: Any, i: int) -> Group:
    if not isinstance(g, dict):
        raise FormError(f"its group {i} is not an object")
    name, desc, size, runs = g.get("name"), g.get("desc", ""), g.get("size"), g.get("ranks")
    if (name is not None and not _text(name)) or not _text(desc):
        raise FormError(f"its group {i} has no name or description as text")
    if size is not None and not _count(size, MAX_RANK):
        raise FormError(f"its group {i}'s size is not a count")
    if runs is not None:
        if not isinstance(runs, list) or len(runs) > MAX_RUNS or not all(
                isinstance(r, list) and len(r) == 3 and all(_count(x, MAX_RANK) for x in r)
                for r in runs):
            raise FormError(f"its group {i}'s ranks are not runs [first, stride, count]")
        if size is not None and sum(r[2] for r in runs) != size:
            raise FormError(f"its group {i}'s ranks do not number its size")
    return Group(name, desc, size, runs)


def read(obj: Any) -> CallTable:
    """The table of a record read from a manifest (untrusted). Raises :class:`FormError`
    saying what is wrong; a record past the limits is refused by its lengths alone, so a
    forged million calls costs nothing to turn away."""
    if not isinstance(obj, dict):
        raise FormError("it is not an object")
    calls, groups = obj.get("calls"), obj.get("groups")
    names, dtypes, folded = obj.get("names"), obj.get("dtypes"), obj.get("folded", [])
    if not isinstance(calls, dict) or not isinstance(calls.get("start"), list):
        raise FormError("it has no calls")
    n = len(calls["start"])
    if n > MAX_CALLS:
        raise FormError(f"it lists {n:,} calls (a summary lists at most {MAX_CALLS:,}; "
                        "the rest are folded)")
    if not isinstance(groups, list) or len(groups) > MAX_GROUPS:
        raise FormError(f"its groups are not a list of at most {MAX_GROUPS}")
    for what, labels in (("names", names), ("dtypes", dtypes)):
        if not isinstance(labels, list) or len(labels) > MAX_LABELS \
                or not all(_text(x) for x in labels):
            raise FormError(f"its {what} are not a list of at most {MAX_LABELS} texts")
    if not isinstance(folded, list) or len(folded) > MAX_FOLDED:
        raise FormError(f"its folded calls are not a list of at most {MAX_FOLDED}")
    table = CallTable()
    table.groups = [_group(g, i) for i, g in enumerate(groups)]
    table.names, table.dtypes = list(names), list(dtypes)  # type: ignore[arg-type]
    base: Any = obj.get("base_us")
    if type(base) not in _FLOAT or not -_HUGE < base < _HUGE:
        raise FormError("its base_us is not a time")
    table.group = _ints(calls.get("group"), "group", max(len(groups), 1), n)
    table.number = _ints(calls.get("number"), "number", MAX_NUMBER, n)
    table.name = _ints(calls.get("name"), "name", max(len(table.names), 1), n)
    table.dtype = _ints(calls.get("dtype"), "dtype", max(len(table.dtypes), 1), n)
    table.bytes = _ints(calls.get("bytes"), "bytes", MAX_NUMBER, n)
    table.base = float(base)
    table.issue = _times(calls.get("issue"), "issue", n, nullable=True)
    table.start = _times(calls.get("start"), "start", n)
    table.end = _times(calls.get("end"), "end", n)
    if n and not (table.groups and table.names and table.dtypes):
        raise FormError("its calls name groups, names or dtypes it does not list")
    for i, row in enumerate(folded):
        if not (isinstance(row, list) and len(row) == 5 and _count(row[0], MAX_GROUPS)
                and _count(row[1], MAX_LABELS) and _count(row[2]) and _count(row[3])
                and type(row[4]) in _FLOAT and 0 <= row[4] < _HUGE):
            raise FormError(f"its folded row {i} is not [group, name, bytes, calls, µs]")
    table.folded = [list(r) for r in folded]
    for key, ok in (("total", _count(obj.get("total"))), ("p2p", _count(obj.get("p2p", 0))),
                    ("capped", isinstance(obj.get("capped", False), bool))):
        if not ok:
            raise FormError(f"its {key} is not a count")
    table.total, table.p2p = obj["total"], obj.get("p2p", 0)
    table.capped = obj.get("capped", False)
    source, clock, numbered = obj.get("source"), obj.get("clock"), obj.get("numbered")
    if (source is not None and not _text(source)) or clock not in ("device", "host") \
            or numbered not in ("seq", "order"):
        raise FormError("its source, clock or numbering is not one of the known words")
    table.source, table.clock, table.numbered = source, clock, numbered
    problems = obj.get("problems", [])
    if not isinstance(problems, list) or len(problems) > MAX_PROBLEMS \
            or not all(_text(p) for p in problems):
        raise FormError(f"its problems are not at most {MAX_PROBLEMS} texts")
    table.problems = list(problems)
    return table


def problem(obj: Any) -> str | None:
    """Why ``obj`` (a summary's ``collectives``, read from a manifest) cannot be used, or
    None when :func:`read` takes it."""
    try:
        read(obj)
    except FormError as err:
        return str(err)
    return None



def shrink(obj: dict[str, Any], most: int) -> dict[str, Any]:
    """The record ``obj`` (as the extractor made it) listing at most its first ``most``
    calls, the others folded per (group, name, bytes) with their count and time, as the
    cap folds them (a summary that must fit a manifest line gives up listing calls
    before it gives up anything else)."""
    calls = obj.get("calls") or {}
    n = len(calls.get("start") or ())
    if n <= most:
        return obj
    most = max(most, 0)
    folded: dict[tuple[int, int, int], list[Any]] = {}
    for row in obj.get("folded") or ():
        folded[(row[0], row[1], row[2])] = [row[0], row[1], row[2], row[3], row[4]]
    for i in range(most, n):
        key = (calls["group"][i], calls["name"][i], calls["bytes"][i])
        found = folded.get(key)
        if found is None:
            if len(folded) >= MAX_FOLDED:
                continue  # counted in total, neither listed nor folded
            found = folded[key] = [*key, 0, 0.0]
        found[3] += 1
        found[4] = round(found[4] + max(calls["end"][i] - calls["start"][i], 0.0), 3)
    return {**obj, "calls": {k: list(v[:most]) for k, v in calls.items()},
            "folded": list(folded.values()), "capped": True}
