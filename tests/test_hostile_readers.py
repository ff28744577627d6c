"""The trace tools read untrusted files in bounded memory and time, and never outside DIR.

Each hostile file is made here, small on disk (a few MB at most), and each command runs in
a fresh process whose CPU time and peak resident memory are measured. The target is 5 s
and 300 MB; the bound asserted is on CPU time, which other work on the machine does not
stretch as it does wall time, and is generous (a bound on work, not a speed test).
"""

from __future__ import annotations

import gzip
import html
import json
import os
import pickle
import subprocess
import sys
import time
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from policy_engine.analysis import chrome_trace
from policy_engine.analysis.manifests import MAX_MANIFEST_LINES
from policy_engine.backends.memory import snapshot
from policy_engine.cli.main import main
from policy_engine.files.layout import MANIFEST_DIR, find_leftovers
from policy_engine.files.publish import publish
from policy_engine.language.values.sizes import human_bytes
from policy_engine.runtime.process.manifest import encode

MiB = 1 << 20
PEAK_LIMIT = 300 * MiB
CPU_LIMIT = 60.0  # CPU seconds of the command and its children; the target is 5 s
MANIFEST = "host_pid1_20260101000000.manifest.jsonl"

# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the (large) test process.
_PEAK = """
import os, sys
from policy_engine.cli.main import main
code = main(sys.argv[1:])
sys.stdout.flush()
with open("/proc/self/status") as f:
    peak = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
cpu = sum(os.times()[:4])  # user and system, its own and its children's
print("peak", peak, cpu, file=sys.stderr)
sys.exit(code)
"""


class Ran:
    def __init__(self, done: subprocess.CompletedProcess[str], seconds: float) -> None:
        self.code = done.returncode
        self.out = done.stdout
        self.err, _, tail = done.stderr.rpartition("peak ")
        peak, cpu = tail.split()
        self.peak = int(peak) * 1024  # in KiB
        self.cpu = float(cpu)
        self.seconds = seconds

    def bounded(self) -> None:
        assert "Traceback" not in self.err, self.err
        assert self.cpu < CPU_LIMIT, f"{self.cpu:.1f} s of CPU"
        assert self.peak < PEAK_LIMIT, f"{self.peak / MiB:.0f} MiB"


def cli(*argv: Any) -> Ran:
    """A command in a fresh process: exit code, output, time and peak memory."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _PEAK, *map(str, argv)],
                          capture_output=True, text=True, timeout=600, check=False)
    ran = Ran(done, time.monotonic() - start)
    print(f"{argv[0]}: exit {ran.code}, {ran.seconds:.1f} s ({ran.cpu:.1f} s of CPU), "
          f"{ran.peak / MiB:.0f} MiB")
    return ran


def manifest(out: Path, records: Iterable[dict[str, Any]]) -> Path:
    path = out / MANIFEST_DIR / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        for record in records:
            f.write(encode(record))
    return path


def trace_line(rank: int, path: str, backend: str = "torch", step: int = 1) -> dict[str, Any]:
    return {"event": "trace", "status": "complete", "role": "actor", "rank": rank,
            "steps": [step], "path": path, "backend": backend, "start": 1.0 + rank}


def small_trace(path: Path, pid: int = 1) -> Path:
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": 1,
               "ts": 10.0, "dur": 5.0}]
    path.write_text(json.dumps({"baseTimeNanoseconds": 1000, "traceEvents": events}))
    return path


def gzip_of(parts: Iterable[bytes]) -> bytes:
    """One gzip member (so its trailer tells the size) of the parts, compressed as they
    come: hundreds of MB of text are never held."""
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    return b"".join([*(packer.compress(p) for p in parts), packer.flush()])


def members(head: bytes, chunk: bytes, times: int, tail: bytes) -> bytes:
    """A gzip of many members, the middle one repeated: its trailer tells only the last
    member's size, so only the reader itself can stop it."""
    middle = gzip.compress(chunk, 9)
    return gzip.compress(head) + middle * times + gzip.compress(tail)


TINY = b'{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":1,"dur":1},'
TINY_MB = TINY * (MiB // len(TINY))


# -- report ------------------------------------------------------------------------------

@pytest.mark.slow
def test_report_stops_a_small_gzip_of_250_mb_of_tiny_events(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    honest = gzip_of([b'{"traceEvents":[', *[TINY_MB] * 250, b'{}]}'])
    (out / "honest.pt.trace.json.gz").write_bytes(honest)
    lying = members(b'{"traceEvents":[', TINY_MB, 250, b'{}]}')
    (out / "lying.pt.trace.json.gz").write_bytes(lying)
    assert len(honest) < 2 * MiB and len(lying) < 2 * MiB
    manifest(out, [trace_line(0, "honest.pt.trace.json.gz"),
                   trace_line(1, "lying.pt.trace.json.gz")])
    ran = cli("report", out, "-o", tmp_path / "r.html")
    assert ran.code == 0, ran.err
    ran.bounded()
    page = (tmp_path / "r.html").read_text()
    assert "operators not read: its gzip trailer says it inflates to 250.0 MiB, over " \
           "128.0 MiB (--max-trace-mb)" in page
    assert "operators not read: it inflates to more than 100 times its size on disk " \
           "(a gzip bomb?)" in page


@pytest.mark.slow
def test_report_of_32_gzip_bombs_is_bounded(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    shapes = {  # what a bomb inflates to
        "events": (b'{"traceEvents":[', TINY_MB, b'{}]}'),
        "spaces": (b'{"traceEvents":[', b" " * MiB, b"]}"),
        "string": (b'{"traceEvents":[{"name":"', b"a" * MiB, b'"}]}'),
        "key": (b'{"other":"', b"a" * MiB, b'","traceEvents":[]}'),
        "nesting": (b'{"traceEvents":[', b"[" * MiB, b"]}"),
        "zeros": (b"", b"\0" * MiB, b""),
    }
    lines = []
    for n in range(32):
        name = list(shapes)[n % len(shapes)]
        head, chunk, tail = shapes[name]
        path = f"bomb{n}_{name}.pt.trace.json.gz"
        (out / path).write_bytes(members(head, chunk, 300, tail))  # 300 MB each
        lines.append(trace_line(n, path))
    manifest(out, lines)
    ran = cli("report", out, "-o", tmp_path / "r.html")
    assert ran.code == 0, ran.err
    ran.bounded()
    page = (tmp_path / "r.html").read_text()
    assert page.count("operators not read:") == 32
    assert "32 trace(s) could not be read for operators; each says why." in page


@pytest.mark.slow
def test_report_and_traces_of_a_200000_line_manifest_are_bounded(tmp_path: Path) -> None:
    out = tmp_path / "out"
    path = out / MANIFEST_DIR / MANIFEST
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:
        for n in range(200_000):
            f.write(b'{"event":"trace","status":"complete","role":"actor","rank":%d,'
                    b'"steps":[%d],"path":"t%d.pt.trace.json"}\n' % (n % 64, n // 64, n))
    ran = cli("report", out, "-o", tmp_path / "r.html", "--ops", "0")
    assert ran.code == 0, ran.err
    ran.bounded()
    page = (tmp_path / "r.html").read_text()
    assert f"{MANIFEST}:{MAX_MANIFEST_LINES + 1}: more than {MAX_MANIFEST_LINES} lines: " \
           "this line and the rest are not read" in page
    ran = cli("traces", out, "--format", "json")
    assert ran.code == 0, ran.err
    ran.bounded()
    assert len(json.loads(ran.out)["traces"]) == MAX_MANIFEST_LINES


# -- merge -------------------------------------------------------------------------------

def window(out: Path, *traces: tuple[str, bytes]) -> None:
    """Rank n's trace is the n-th (name, content)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, content in traces:
        (out / name).write_bytes(content)
    manifest(out, [trace_line(rank, name) for rank, (name, _) in enumerate(traces)])


@pytest.mark.slow
def test_merge_of_1_5_million_thread_ids_stops_with_a_data_error(tmp_path: Path) -> None:
    event = b'{"ph":"X","name":"a","pid":1,"tid":%d,"ts":%d,"dur":1},'
    body = (b"".join(event % (t, t) for t in range(start, start + 100_000))
            for start in range(0, 1_500_000, 100_000))
    packed = gzip_of([b'{"traceEvents":[', *body, b'{}]}'])
    assert len(packed) < 8 * MiB
    window(tmp_path / "out", ("many.pt.trace.json.gz", packed),
           ("ok.pt.trace.json", small_trace(tmp_path / "ok.json").read_bytes()))
    ran = cli("merge", tmp_path / "out", "-o", tmp_path / "m.json")
    assert ran.code == 1
    ran.bounded()
    assert "many.pt.trace.json.gz: more than 65536 threads (distinct pid and tid pairs): " \
           "too many to merge, at event 65537 of traceEvents (before character " in ran.err
    assert not (tmp_path / "m.json").exists() and not find_leftovers(str(tmp_path))


@pytest.mark.slow
def test_merge_of_12_top_level_keys_of_60_mb_stops_with_a_data_error(tmp_path: Path) -> None:
    chunk = gzip.compress(b"x" * MiB, 9)
    parts = [gzip.compress(b'{"traceEvents":[],')]
    for key in range(12):
        parts += [gzip.compress(b'"k%d":"' % key), chunk * 60,
                  gzip.compress(b'",' if key < 11 else b'"}')]
    window(tmp_path / "out", ("keys.pt.trace.json.gz", b"".join(parts)))
    assert (tmp_path / "out" / "keys.pt.trace.json.gz").stat().st_size < 2 * MiB
    ran = cli("merge", tmp_path / "out", "-o", tmp_path / "m.json")
    assert ran.code == 1
    ran.bounded()
    # 720 MB from under 2: merge refuses it as analyze and report do, before the keys
    assert "keys.pt.trace.json.gz: it inflates to more than 100 times its size on disk " \
           "(a gzip bomb?)" in ran.err
    plain = b'{"traceEvents":[],"k0":"' + b"x" * (9 * MiB) + b'","k1":"' + \
        b"x" * (9 * MiB) + b'"}'
    window(tmp_path / "plain", ("keys.pt.trace.json", plain))
    ran = cli("merge", tmp_path / "plain", "-o", tmp_path / "m.json")
    assert ran.code == 1
    ran.bounded()
    assert "keys.pt.trace.json: the top-level keys but traceEvents are larger than 16 " \
           "MiB together (at character 9437215)" in ran.err


@pytest.mark.parametrize(("number", "why"), [
    (b"9" * 5000, "a number has too many digits"),
    (b"-" + b"9" * 5000, "a number has too many digits"),
    (b"1e400", "the number 1e400 is out of range"),
    (b"-1e400", "the number -1e400 is out of range"),
    (b"NaN", "NaN is not a JSON number"),
    (b"Infinity", "Infinity is not a JSON number"),
    (b"-Infinity", "-Infinity is not a JSON number"),
])
@pytest.mark.parametrize("where", ["ts", "args", "meta"])
def test_a_number_json_cannot_carry_is_a_data_error_with_its_place(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], number: bytes, why: str,
        where: str) -> None:
    event = b'{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"dur":1}'
    if where == "ts":
        bad = b'{"traceEvents":[%s,{"ph":"X","ts":%s}]}' % (event, number)
    elif where == "args":
        bad = b'{"traceEvents":[%s,{"args":{"x":[1,{"y":%s}]}}]}' % (event, number)
    else:
        bad = b'{"traceEvents":[%s],"deviceProperties":[{"x":%s}]}' % (event, number)
    # where the value holding the number begins
    place = (f"in the top-level key 'deviceProperties', at or after character "
             f"{bad.rindex(b'[{')}" if where == "meta" else
             f"in event 2 of traceEvents, at or after character {len(event) + 17}")
    window(tmp_path / "out", ("ok.pt.trace.json", small_trace(tmp_path / "ok.json").read_bytes()),
           ("bad.pt.trace.json", bad))
    assert main(["merge", str(tmp_path / "out"), "-o", str(tmp_path / "m.json")]) == 1
    err = capsys.readouterr().err
    assert err == f"policy-engine merge: error: bad.pt.trace.json: {why} {place}\n"
    assert sorted(os.listdir(tmp_path)) == ["ok.json", "out"]


def test_merge_reads_numbers_past_a_clock_as_no_clock_or_a_data_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A baseTimeNanoseconds of thousands of digits is no clock (the timestamps are taken
    as they are, and said); an integer timestamp past a float's range, moved by a
    fraction of a microsecond to align the clocks, is a data error naming the trace."""
    def trace(base: str, ts: str) -> bytes:
        return (b'{"baseTimeNanoseconds": %s, "traceEvents": [{"ph": "X", "name": "a", '
                b'"pid": 1, "tid": 1, "ts": %s, "dur": 1}]}' % (base.encode(), ts.encode()))

    window(tmp_path / "clock", ("a.pt.trace.json", trace("1" + "0" * 4000 + "1", "1.5")),
           ("b.pt.trace.json", trace("1000", "1.5")))
    assert main(["merge", str(tmp_path / "clock"), "-o", str(tmp_path / "m.json")]) == 0
    assert capsys.readouterr().err == (
        "policy-engine merge: note: a.pt.trace.json: its baseTimeNanoseconds is no time in "
        "nanoseconds (a whole number from 0 to 2**63): its timestamps are taken as Unix "
        "microseconds\n")
    window(tmp_path / "ts", ("a.pt.trace.json", trace("1001", "1" + "0" * 400)),
           ("b.pt.trace.json", trace("0", "1.5")))
    assert main(["merge", str(tmp_path / "ts"), "-o", str(tmp_path / "n.json")]) == 1
    assert capsys.readouterr().err == (
        "policy-engine merge: error: a.pt.trace.json: a timestamp of 401 digits: no time, at "
        "event 1 of traceEvents (before character 509)\n")
    assert not (tmp_path / "n.json").exists()


def test_merge_never_reads_outside_dir(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    secret = small_trace(tmp_path / "secret.pt.trace.json", pid=7)
    (tmp_path / "elsewhere").mkdir()
    small_trace(tmp_path / "elsewhere" / "t.pt.trace.json", pid=8)
    out.mkdir()
    (out / "linked").symlink_to(tmp_path / "elsewhere")
    small_trace(out / "ok.pt.trace.json")
    manifest(out, [trace_line(0, "ok.pt.trace.json"),
                   trace_line(1, "../secret.pt.trace.json"),
                   trace_line(2, str(secret)),
                   trace_line(3, "linked/t.pt.trace.json")])
    assert main(["merge", str(out), "-o", str(tmp_path / "m.json")]) == 0
    err = capsys.readouterr().err
    where = f"policy-engine merge: warning: manifest {out / MANIFEST_DIR / MANIFEST}"
    assert f"{where}:2: path \"../secret.pt.trace.json\" leaves the output folder; " \
           "not followed\n" in err
    assert f"{where}:3: path \"{secret}\" is absolute: a manifest names files inside its " \
           "output folder; not followed\n" in err
    assert f"{where}:4: path \"linked/t.pt.trace.json\" reaches outside the output " \
           "folder through a symbolic link; not followed\n" in err
    merged = json.loads((tmp_path / "m.json").read_text())
    assert {e["pid"] for e in merged["traceEvents"]} == {1}


def test_merge_never_replaces_an_input_even_with_force(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    small_trace(out / "a.pt.trace.json")
    small_trace(out / "b.pt.trace.json")
    (out / "mem.pickle").write_bytes(b"snapshot")
    (out / "other.pt.trace.json").write_text("another window")
    path = manifest(out, [trace_line(0, "a.pt.trace.json"), trace_line(1, "b.pt.trace.json"),
                          trace_line(0, "mem.pickle", backend="memory"),
                          trace_line(0, "other.pt.trace.json", step=2)])
    (tmp_path / "hard.json").hardlink_to(out / "a.pt.trace.json")
    before = {p: p.read_bytes() for p in [*out.rglob("*"), tmp_path / "hard.json"]
              if p.is_file()}
    for target, why in ((out / "a.pt.trace.json", "is one of the traces to merge"),
                        (out / "mem.pickle", "is one of the traces to merge"),
                        (tmp_path / "hard.json", "is one of the traces to merge"),
                        (path, "is a manifest or a file the manifests under the folder name"),
                        (out / "other.pt.trace.json",
                         "is a manifest or a file the manifests under the folder name")):
        assert main(["merge", str(out), "--step", "1", "-o", str(target), "--force"]) == 2
        assert why in capsys.readouterr().err, target
    assert {p: p.read_bytes() for p in before} == before
    assert not find_leftovers(str(tmp_path))


# -- traces ------------------------------------------------------------------------------

def test_traces_lists_no_trigger_request_and_follows_no_path_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    (out / "triggers").mkdir(parents=True)
    (out / "triggers" / "20260101000000-ab12cd34.json").write_text('{"role": "actor"}')
    (out / "triggers" / ".20260101000000-ab12cd34.tmp").write_text("{")
    small_trace(out / "a.pt.trace.json")
    (tmp_path / "outside.pt.trace.json").write_text("{}")
    manifest(out, [trace_line(0, "a.pt.trace.json"),
                   trace_line(1, "../outside.pt.trace.json")])
    assert main(["traces", str(out), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["unlisted"] == [] and data["missing"] == []
    assert [r["path"] for r in data["traces"]] == ["a.pt.trace.json", None]
    assert data["bad_lines"] == [{
        "manifest": str(out / MANIFEST_DIR / MANIFEST), "line": 2,
        "why": 'path "../outside.pt.trace.json" leaves the output folder; not followed'}]


# -- memory-plot -------------------------------------------------------------------------

def repeated_references() -> bytes:
    """6 KB that stand for a billion frames: every level is one object, referred to a
    thousand times (the pickle's memo)."""
    frame = {"filename": "train.py", "line": 1, "name": "step"}
    block = {"address": 0, "size": 1, "state": "active_allocated", "frames": [frame] * 1000}
    segment = {"device": 0, "total_size": 1, "blocks": [block] * 1000}
    return pickle.dumps({"segments": [segment] * 1000, "device_traces": [[]]}, protocol=4)


@pytest.mark.slow
def test_memory_plot_refuses_a_pickle_of_repeated_references(tmp_path: Path) -> None:
    data = repeated_references()
    assert len(data) < 8 << 10
    snap = tmp_path / "memo.pickle"
    snap.write_bytes(data)
    ran = cli("memory-plot", snap)
    assert ran.code == 2
    ran.bounded()
    limit = snapshot.WORK_FLOOR + snapshot.WORK_PER_BYTE * len(data)
    assert ran.err == (f"policy-engine memory-plot: {snap}: it refers to the same data over "
                       f"and over: more than {limit:,} items to replay from "
                       f"{human_bytes(len(data))} (a damaged or hostile pickle)\n")
    assert not (tmp_path / "memo.html").exists() and not find_leftovers(str(tmp_path))


def test_memory_plot_replaces_a_page_only_with_force(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snap = tmp_path / "s.pickle"
    snap.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]]}))
    page = tmp_path / "s.html"
    page.write_text("keep me")
    assert main(["memory-plot", str(snap)]) == 2
    assert capsys.readouterr().err == \
        f"policy-engine memory-plot: error: {page} exists (--force replaces it)\n"
    assert page.read_text() == "keep me"
    assert main(["memory-plot", str(snap), "--force"]) == 0
    assert page.read_text().startswith("<!DOCTYPE html>")
    assert sorted(os.listdir(tmp_path)) == ["s.html", "s.pickle"]


# -- the one publisher -------------------------------------------------------------------

def test_publish_is_whole_exclusive_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "page.html"
    seen: list[list[str]] = []

    def write(f: Any) -> None:
        seen.append(find_leftovers(str(tmp_path)))  # the temporary file is a known name
        f.write(b"first")

    assert publish(str(target), write) == 5
    assert seen[0][0].startswith(".policy-engine-") and target.read_bytes() == b"first"
    with pytest.raises(FileExistsError):
        publish(str(target), lambda f: f.write(b"second"))
    assert target.read_bytes() == b"first"

    def fail(f: Any) -> None:
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        publish(str(target), fail, force=True)
    assert target.read_bytes() == b"first"
    (tmp_path / "elsewhere").write_text("not this")
    link = tmp_path / "link.html"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileExistsError):
        publish(str(link), lambda f: f.write(b"x"))
    publish(str(link), lambda f: f.write(b"x"), force=True)  # the link is replaced
    assert not link.is_symlink() and (tmp_path / "elsewhere").read_text() == "not this"
    assert find_leftovers(str(tmp_path)) == []


def test_the_reader_bounds_the_top_level_keys_and_the_bytes(tmp_path: Path,
                                                            monkeypatch: Any) -> None:
    monkeypatch.setattr(chrome_trace, "MAX_META", 100)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"a": "x" * 60, "b": "y" * 60, "traceEvents": []}))
    with chrome_trace.TraceReader(str(path)) as reader, pytest.raises(
            chrome_trace.TraceError, match="larger than 100 B together"):
        reader.header()
    path.write_text(json.dumps({"traceEvents": [{"name": "x" * 100}] * 100}))
    with chrome_trace.TraceReader(str(path), max_bytes=1000) as reader, pytest.raises(
            chrome_trace.TraceTooLarge, match=r"^it is more than 1000 B of text"):
        list(reader.events())


def test_what_the_manifests_can_make_a_reader_hold_is_capped(tmp_path: Path,
                                                             monkeypatch: Any) -> None:
    from policy_engine.analysis import manifests as m

    line = b'{"status":"complete","rank":1,"path":"t.json"}\n'
    for name in ("a", "b"):
        path = tmp_path / MANIFEST_DIR / f"{name}{m.MANIFEST_SUFFIX}"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(line * 10)

    def stops(**limits: int) -> list[tuple[str, int | None, str]]:
        for key, value in limits.items():
            monkeypatch.setattr(m, key, value)
        scan = m.scan_manifests(str(tmp_path))
        monkeypatch.undo()
        return [(os.path.basename(p.path), p.line, p.why) for p in scan.problems]

    assert stops() == []
    assert stops(MAX_MANIFEST_LINES=4) == [
        (name, 5, "more than 4 lines: this line and the rest are not read")
        for name in (f"a{m.MANIFEST_SUFFIX}", f"b{m.MANIFEST_SUFFIX}")]
    assert stops(MAX_MANIFEST_BYTES=len(line) * 3) == [
        (name, 4, "more than 0 MiB: this line and the rest are not read")
        for name in (f"a{m.MANIFEST_SUFFIX}", f"b{m.MANIFEST_SUFFIX}")]
    assert stops(MAX_RECORDS=12) == [(f"b{m.MANIFEST_SUFFIX}", 3, "the manifests hold more "
                                      "than 12 records together: this line and the rest "
                                      "are not read")]
    assert stops(MAX_SCAN_BYTES=len(line) * 15) == [
        (f"b{m.MANIFEST_SUFFIX}", 6, "the manifests hold more than 0 MiB together: this "
         "line and the rest are not read")]


# -- analyze, compare and report beside one hostile trace ------------------------------------

def test_a_step_number_of_5000_digits_makes_one_rank_unreadable(tmp_path: Path) -> None:
    from analysis_traces import make_run

    base, new = tmp_path / "base", tmp_path / "new"
    make_run(str(base), 4, steps=8, ops=6, gz=False)
    paths = make_run(str(new), 4, steps=8, ops=6, gz=False)
    hostile = new / paths[2]
    doc = json.loads(hostile.read_text())
    for event in doc["traceEvents"]:
        if event.get("name") == "ProfilerStep#3":
            event["name"] = "ProfilerStep#" + "9" * 5000
    hostile.write_text(json.dumps(doc))
    why = "a ProfilerStep row's step number has 5000 digits (at most 18), at event "
    for argv in (("analyze", new), ("analyze", new, "--jobs", "1"), ("compare", base, new),
                 ("compare", base, new, "--format", "json")):
        ran = cli(*argv)
        assert ran.code == 0, ran.err
        ran.bounded()
        assert why in ran.out
    ran = cli("report", new, "-o", tmp_path / "r.html", "--baseline", base)
    assert ran.code == 0, ran.err
    ran.bounded()
    page = html.unescape((tmp_path / "r.html").read_text())
    assert f"the trace of rank 2 cannot be read: {why}" in page
    assert f"left out: new rank 2: {why}" in page
    assert "<h2>Against the baseline</h2>" in page
    done = json.loads(cli("analyze", new, "--format", "json").out)
    (w,) = done["windows"]
    assert [r["rank"] for r in w["ranks"] if "error" in r] == [2]
    assert [r["ranks"] for r in w["readiness"] if r["code"] == "unreadable"] == [[2]]


def test_numbers_of_hundreds_of_digits_in_a_manifest_are_bad_lines(tmp_path: Path) -> None:
    from analysis_traces import make_run

    out = tmp_path / "out"
    make_run(str(out), 2, steps=4, ops=4)
    big = "1" + "0" * 400
    bad = [b'{"event":"trace","status":"complete","role":"trainer","rank":1,"steps":[1],'
           b'"path":"x.pt.trace.json","start":%s}' % big.encode(),
           b'{"event":"trace","status":"complete","role":"trainer","rank":%s,"steps":[1],'
           b'"path":"x.pt.trace.json"}' % big.encode(),
           b'{"event":"trace","status":"complete","role":"trainer","rank":1,"steps":[0,%s],'
           b'"step_count":%s1,"path":"x.pt.trace.json"}' % (big.encode(), big.encode()),
           b'{"event":"summary","capture":"1","path":"x","status":"failed","kept":true,'
           b'"seconds":%s}' % big.encode()]
    with open(out / MANIFEST_DIR / MANIFEST, "wb") as f:
        f.write(b"\n".join(bad) + b"\n")
    where = f"{out / MANIFEST_DIR / MANIFEST}"
    said = [f"{where}:1: start: expected a number, got 1000",
            f"{where}:2: rank: expected an integer or null, got 1000",
            f"{where}:3: steps: expected a list of integers or strings, got [0, 1000",
            f"{where}:4: seconds: expected a number of seconds, got 1000"]
    for argv in (("analyze", out), ("traces", out), ("compare", out, out),
                 ("merge", out, "-o", tmp_path / "m.json"),
                 ("report", out, "-o", tmp_path / "r.html")):
        ran = cli(*argv)
        assert ran.code == 0, ran.err
        ran.bounded()
        shown = ran.out + ran.err + (
            (tmp_path / "r.html").read_text() if argv[0] == "report" else "")
        if argv[0] != "compare":  # compare says what it compares, not the manifests' state
            assert all(line in shown for line in said), shown


def test_report_and_analyze_take_timestamps_of_hundreds_of_digits_as_no_time(
        tmp_path: Path) -> None:
    big = "1" + "0" * 400
    events = [b'{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":%s,"dur":1.5}',
              b'{"ph":"X","cat":"cpu_op","name":"b","pid":1,"tid":1,"ts":2.5,"dur":%s}',
              b'{"ph":"X","cat":"cpu_op","name":"c","pid":1,"tid":1,"ts":-%s,"dur":%s}',
              b'{"ph":"X","cat":"cpu_op","name":"kept","pid":1,"tid":1,"ts":3.5,"dur":7.0}']
    body = b",".join(e.replace(b"%s", big.encode()) for e in events)
    window(tmp_path / "out", ("a.pt.trace.json", b'{"traceEvents": [%s]}' % body))
    for argv in (("report", tmp_path / "out", "-o", tmp_path / "r.html"),
                 ("analyze", tmp_path / "out")):
        ran = cli(*argv)
        assert ran.code == 0, ran.err
        ran.bounded()
    page = (tmp_path / "r.html").read_text()
    assert "<td>kept</td>" in page and "<td>a</td>" not in page
