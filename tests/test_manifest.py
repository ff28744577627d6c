"""The manifest: whole lines or nothing on write; every damaged line reported on read."""

from __future__ import annotations

import json
import math
import os
import socket
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from policy_engine.analysis import manifests
from policy_engine.analysis.manifests import ManifestProblem, read_manifests, scan_manifests
from policy_engine.files import layout
from policy_engine.runtime.process import manifest, state
from policy_engine.runtime.process.manifest import append

OPEN = {"event": "open", "capture": "1", "role": "actor", "rank": 0, "steps": [3],
        "start": 10.0}
TRACE = {"event": "trace", "capture": "1", "role": "actor", "rank": 0, "world": 2,
         "path": "t.json", "bytes": 4, "status": "complete", "steps": [3], "cycle": 0,
         "inner_steps": [1, 2], "joined": [], "start": 10.0, "end": 11.0}
CLOSE = {"event": "close", "capture": "1", "status": "complete", "end": 12.0, "steps": [3],
         "traces": 1}


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "out"


def lines_of(out: Path) -> list[bytes]:
    return Path(manifest.manifest_path(str(out))).read_bytes().splitlines(keepends=True)


def write_manifest(out: Path, *lines: bytes, name: str = "h_pid1_20260101000000") -> Path:
    path = out / "manifests" / f"{name}.manifest.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(lines))
    return path


def test_records_are_appended_as_lines_and_read_back(out: Path) -> None:
    for record in (OPEN, TRACE, CLOSE):
        append(str(out), record)
    path = manifest.manifest_path(str(out))
    host = socket.gethostname().split(".")[0] or "host"
    assert os.path.basename(path).startswith(f"{host}_pid{os.getpid()}_")
    scan = scan_manifests(str(out))
    assert scan.problems == ()
    assert [{k: v for k, v in r.items() if k not in ("_manifest", "_file", "_line")}
            for r in scan.records] == [OPEN, TRACE, CLOSE]
    assert [(r["_manifest"], r["_line"]) for r in scan.records] == [
        (path, 1), (path, 2), (path, 3)]


def test_read_manifests_gives_trace_records_old_and_new(out: Path) -> None:
    old = {k: v for k, v in TRACE.items() if k not in ("event", "capture")}
    path = write_manifest(out, *(json.dumps(r).encode() + b"\n" for r in (old, OPEN, TRACE, CLOSE)))
    rows = read_manifests(str(out))
    assert [r["event"] for r in rows] == ["trace", "trace"]
    assert all(r["_manifest"] == str(path) and "_line" not in r and "_file" not in r
               for r in rows)


def test_a_short_write_is_cut_back_off(out: Path, monkeypatch: Any) -> None:
    append(str(out), OPEN)
    before = lines_of(out)
    real_write = os.write

    def short(fd: int, data: bytes) -> int:
        return real_write(fd, data[: len(data) // 2])

    monkeypatch.setattr(os, "write", short)
    with pytest.raises(OSError, match="short write"):
        append(str(out), TRACE)
    monkeypatch.undo()
    assert lines_of(out) == before
    append(str(out), CLOSE)
    assert scan_manifests(str(out)).problems == ()


def test_a_write_that_fails_after_writing_part_is_cut_back_off(
        out: Path, monkeypatch: Any) -> None:
    append(str(out), OPEN)
    before = lines_of(out)
    real_write = os.write

    def partial_then_fail(fd: int, data: bytes) -> int:
        real_write(fd, data[:10])
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "write", partial_then_fail)
    with pytest.raises(OSError, match="Input/output"):
        append(str(out), TRACE)
    monkeypatch.undo()
    assert lines_of(out) == before


def test_a_line_is_never_glued_onto_a_torn_one(out: Path) -> None:
    path = Path(manifest.manifest_path(str(out)))
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"event": "open", "capt')  # left by a crash or a full disk
    append(str(out), CLOSE)
    scan = scan_manifests(str(out))
    assert [r["event"] for r in scan.records] == ["close"]
    assert [(p.line, p.why.split(":")[0]) for p in scan.problems] == [(1, "not JSON")]


def test_lines_are_ascii_json_whatever_the_record_holds(out: Path) -> None:
    append(str(out), dict(TRACE, role="act\ud800or", path="tr\udcffé.json", extra={"x": math.nan},
                          error=Path("p"), coords={1: 2, "tp": 0}))
    raw = b"".join(lines_of(out))
    raw.decode("ascii")
    record = scan_manifests(str(out)).records[0]
    assert record["role"] == "act\ufffdor" and record["path"] == "tr\ufffdé.json"
    assert record["extra"] == {"x": None} and record["error"] == "p"
    assert record["coords"] == {"1": 2, "tp": 0}
    record["role"].encode("utf-8")  # prints and encodes


def test_a_forked_child_writes_its_own_manifest(out: Path) -> None:
    parent = manifest.manifest_path(str(out))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(0 if manifest.manifest_path(str(out)) != parent else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


BAD_LINES: list[tuple[bytes, str]] = [
    (b'{"role": "act\xff"}', "not UTF-8 (byte 0xff at column 14)"),
    (b"{role: 1}", "not JSON: Expecting property name enclosed in double quotes"),
    (b"[1, 2]", "not a JSON object (a list)"),
    (b'"text"', "not a JSON object (a str)"),
    (b'{"status": "complete", "start": NaN}', "not JSON: NaN is not a JSON value"),
    (b'{"status": "complete", "start": 1e999}', "start: expected a number, got null"),
    (b"[" * 100_000, "not JSON: nested too deeply"),
    (b'{"status": "complete", "rank": 1' + b"0" * 5000 + b"}", "not JSON: Exceeds the limit"),
    (b'{"event": "crash", "capture": "1"}', "event: unknown kind 'crash'"),
    (b'{"event": "open"}', "capture: missing (every open record has one)"),
    (b'{"event": "close", "capture": "1"}', "status: missing (every close record has one)"),
    (b'{"rank": 0}', "status: missing (every trace record has one)"),
    (b'{"status": "done"}', 'status: expected one of complete, partial, failed, oom, got "done"'),
    (b'{"event": "close", "capture": "1", "status": "gone"}',
     "status: expected one of complete, partial, failed, interrupted"),
    (b'{"status": "complete", "rank": "0"}', 'rank: expected an integer or null, got "0"'),
    (b'{"status": "complete", "rank": true}', "rank: expected an integer or null, got true"),
    (b'{"status": "complete", "world": 1.5}', "world: expected an integer or null, got 1.5"),
    (b'{"status": "complete", "cycle": []}', "cycle: expected an integer or null, got []"),
    (b'{"status": "complete", "path": 3}', "path: expected a string or null, got 3"),
    (b'{"status": "complete", "bytes": -1}', "bytes: expected a byte count or null, got -1"),
    (b'{"status": "complete", "steps": 3}', "steps: expected a list of integers or strings"),
    (b'{"status": "complete", "steps": [null]}', "steps: expected a list of integers or strin"),
    (b'{"status": "complete", "inner_steps": {}}', "inner_steps: expected a list of integers"),
    (b'{"status": "complete", "joined": "ref"}', "joined: expected a list of integers or str"),
    (b'{"status": "complete", "start": "now"}', 'start: expected a number, got "now"'),
    (b'{"status": "complete", "end": null}', "end: expected a number, got null"),
    (b'{"status": "complete", "role": ["a"]}', "role: expected a string or null"),
    (b'{"status": "complete", "pid": 0}', "pid: expected a positive integer or null, got 0"),
    (b'{"event": "open", "capture": 1}', "capture: expected a string, got 1"),
    (b'{"event": "close", "capture": "1", "status": "complete", "traces": -2}',
     "traces: expected a count, got -2"),
    (b'{"event": "close", "capture": "1", "status": "complete", "thread_waits": 1.0}',
     "thread_waits: expected a count, got 1.0"),
    (b'{"event": "close", "capture": "1", "status": "complete", "deferred": "1"}',
     'deferred: expected a count, got "1"'),
    (b'{"event": "close", "capture": "1", "status": "partial", "stopped_by": 15}',
     "stopped_by: expected a string or null, got 15"),
    (b'{"status": "complete", "coords": [0]}', "coords: expected an object or null, got [0]"),
]


@pytest.mark.parametrize(("line", "why"), BAD_LINES, ids=[w[:30] for _, w in BAD_LINES])
def test_every_bad_line_is_reported_with_its_place(out: Path, line: bytes, why: str) -> None:
    good = json.dumps(TRACE).encode() + b"\n"
    path = write_manifest(out, good, line + b"\n", good)
    scan = scan_manifests(str(out))
    assert [r["_line"] for r in scan.records] == [1, 3]
    [problem] = scan.problems
    assert (problem.path, problem.line) == (str(path), 2)
    assert problem.why.startswith(why), problem.why


def test_half_a_line_at_the_end_is_reported(out: Path) -> None:
    good = json.dumps(TRACE).encode() + b"\n"
    path = write_manifest(out, good, b'{"role": "actor", "rank": 0, "pa')
    scan = scan_manifests(str(out))
    assert len(scan.records) == 1
    assert scan.problems == (ManifestProblem(str(path), 2, "half a line at the end of the file "
                                             "(no newline): not JSON: Unterminated string "
                                             "starting at: line 1 column 30 (char 29)"),)


def test_a_whole_last_line_without_its_newline_is_read(out: Path) -> None:
    write_manifest(out, json.dumps(TRACE).encode())
    scan = scan_manifests(str(out))
    assert len(scan.records) == 1 and scan.problems == ()


def test_a_line_too_long_is_skipped_not_loaded(out: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(manifests, "MAX_LINE_BYTES", 100)
    good = json.dumps({"status": "complete"}).encode() + b"\n"
    path = write_manifest(out, good, b"x" * 250 + b"\n", good, b"y" * 150)
    scan = scan_manifests(str(out))
    assert [r["_line"] for r in scan.records] == [1, 3]
    assert scan.problems == (ManifestProblem(str(path), 2, "longer than 100 bytes"),
                             ManifestProblem(str(path), 4, "longer than 100 bytes"))


def test_blank_lines_are_ignored(out: Path) -> None:
    write_manifest(out, b"\n", json.dumps(TRACE).encode() + b"\n", b"  \n")
    scan = scan_manifests(str(out))
    assert len(scan.records) == 1 and scan.problems == ()


def test_lone_surrogate_escapes_are_neutralised(out: Path) -> None:
    write_manifest(out, b'{"status": "complete", "role": "\\ud800", "extra": {"\\udfff": '
                        b'["\\udc80"]}, "path": "a\\ud83d\\ude00"}\n')
    [record] = scan_manifests(str(out)).records
    assert record["role"] == "\ufffd" and record["extra"] == {"\ufffd": ["\ufffd"]}
    assert record["path"] == "a\U0001f600"  # a proper pair stays


def test_files_that_cannot_be_read_are_reported(out: Path, tmp_path: Path) -> None:
    folder = out / "manifests"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "fifo.manifest.jsonl")  # would block a plain open()
    (tmp_path / "elsewhere.txt").write_text(json.dumps(TRACE) + "\n")
    (folder / "link.manifest.jsonl").symlink_to(tmp_path / "elsewhere.txt")
    (folder / "dir.manifest.jsonl").mkdir()
    scan = scan_manifests(str(out))
    assert scan.records == ()
    assert sorted((os.path.basename(p.path), p.line, p.why.split(":")[0])
                  for p in scan.problems) == [
        ("fifo.manifest.jsonl", None, "not a regular file"),
        ("link.manifest.jsonl", None, "cannot read it")]


def test_a_missing_folder_reads_as_nothing(tmp_path: Path) -> None:
    scan = scan_manifests(str(tmp_path / "nope"))
    assert scan.records == ()


def test_close_lines_old_and_new_read_back(out: Path) -> None:
    """``thread_waits`` is written; ``deferred`` (its older name) still reads."""
    close = {"event": "close", "capture": "1", "status": "partial", "end": 2.0, "traces": 1}
    write_manifest(out, json.dumps({**close, "deferred": 2}).encode() + b"\n",
                   json.dumps({**close, "thread_waits": 2,
                               "stopped_by": "SIGTERM arrived"}).encode() + b"\n")
    scan = scan_manifests(str(out))
    assert scan.problems == ()
    assert [(r.get("deferred"), r.get("thread_waits"), r.get("stopped_by"))
            for r in scan.records] == [(2, None, None), (None, 2, "SIGTERM arrived")]


def test_an_endless_merged_capture_closes_with_a_small_line(make_policy: Any,
                                                            out: Path) -> None:
    """Merged steps that go on as long as the run: the close and trace lines give the first
    and last step and how many, not every step; the readers take both forms."""
    from policy_engine import Topology, apply_policy
    from policy_engine.analysis.listing import collect
    from policy_engine.analysis.manifests import closed_steps
    from policy_engine.testing import recording_backend

    class Worker:
        pass

    policy = make_policy(steps="all", merge_steps=True)
    with recording_backend("torch"):
        prof = apply_policy(Worker(), "actor", policy, Topology(rank=0, world=1))
        for n in range(1, 5001):
            with prof.training_step(n):
                pass
        prof.close()
    [close] = [line for line in lines_of(out) if b'"close"' in line]
    assert len(close) < 400, close
    [trace] = [line for line in lines_of(out) if b'"trace"' in line]
    assert len(trace) < 1000 and b'"step_count":5000' in trace.replace(b" ", b""), trace
    [traced] = [r for r in scan_manifests(str(out)).records if r["event"] == "trace"]
    assert traced["steps"] == list(range(1, 5001)) and "step_count" not in traced
    [record] = [r for r in scan_manifests(str(out)).records if r["event"] == "close"]
    assert (record["steps"], record["step_count"]) == ([1, 5000], 5000)
    assert closed_steps(record) == range(1, 5001)
    assert closed_steps({"steps": [3, 4]}) == [3, 4]  # a short capture lists its steps
    listed = collect(str(out))
    assert listed["interrupted"] == [] and len(listed["traces"]) == 1


def test_steps_listed_again_count_towards_what_a_scan_reads(tmp_path: Path) -> None:
    """A trace line's first-and-last steps are listed when read, each step counted as if
    written out: short lines with huge counts cannot make a reader hold more than the
    scan's byte limit allows, and a count past LISTED_MOST stays as written."""
    def line(n: int, first: int, count: int) -> bytes:
        return json.dumps({"event": "trace", "capture": f"1-{n}", "status": "complete",
                           "steps": [first, first + count - 1], "step_count": count}
                          ).encode() + b"\n"
    write_manifest(tmp_path, line(0, 0, 10**12), name="a")
    write_manifest(tmp_path, *(line(n, 0, manifests.LISTED_MOST) for n in range(1, 40)),
                   name="b")
    scan = scan_manifests(str(tmp_path))
    huge, *listed = scan.records
    assert huge["steps"] == [0, 10**12 - 1] and huge["step_count"] == 10**12
    per_file = manifests.MAX_MANIFEST_BYTES // (manifests.LISTED_MOST * manifests.STEP_BYTES)
    assert len(listed) == per_file  # the next line is past the file's limit
    assert all(len(r["steps"]) == manifests.LISTED_MOST for r in listed)
    [problem] = scan.problems
    assert problem.line == per_file + 1 and "more than 16 MiB" in problem.why


# -- what sits under the manifest's name; files that rotate -----------------------------

def _files(out: Path) -> list[str]:
    return sorted(os.listdir(out / "manifests"), key=lambda n: layout.manifest_part(n) or ("", 0))


@pytest.mark.parametrize("long", [False, True], ids=["short line", "line over a pipe's 64 KiB"])
def test_a_fifo_under_the_manifest_name_is_never_written_nor_waited_on(
        out: Path, caplog: Any, long: bool) -> None:
    append(str(out), OPEN)
    path = manifest.manifest_path(str(out))
    os.unlink(path)
    os.mkfifo(path)
    record = dict(TRACE, error="x" * (200 << 10) if long else "short")
    done = threading.Event()

    def write() -> None:
        for _ in range(3):
            append(str(out), record)
        done.set()

    threading.Thread(target=write, daemon=True).start()  # stuck for good if it blocks
    assert done.wait(60), "append blocked on the FIFO"
    said = [r.getMessage() for r in caplog.records if "manifest" in r.getMessage()]
    assert said == [f"policy-engine: the manifest {path} is a FIFO, not a regular file: "
                    "lines meant for it are not written (training goes on; said once)"]
    assert stat.S_ISFIFO(os.lstat(path).st_mode)


def test_a_folder_under_the_manifest_name_drops_the_line_with_a_word(
        out: Path, caplog: Any) -> None:
    os.makedirs(manifest.manifest_path(str(out)))
    append(str(out), OPEN)  # no IsADirectoryError: training goes on
    assert "is a folder, not a regular file" in caplog.text


def test_no_lock_the_other_threads_need_is_held_while_a_line_is_written(
        out: Path, monkeypatch: Any) -> None:
    """The training and export threads take the process's lock (STATE.lock); a write that
    takes long (a slow disk) must not keep them waiting."""
    writing, release = threading.Event(), threading.Event()
    real_write = os.write

    def slow(fd: int, data: bytes) -> int:
        writing.set()
        release.wait(60)
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", slow)
    thread = threading.Thread(target=append, args=(str(out), OPEN), daemon=True)
    thread.start()
    assert writing.wait(60)
    try:
        got = state.STATE.lock.acquire(timeout=30)
        assert got, "the process's lock is held while a manifest line is written"
        state.STATE.lock.release()
    finally:
        release.set()
        thread.join(60)
    monkeypatch.undo()
    assert [json.loads(line) for line in lines_of(out)] == [OPEN]


def test_a_manifest_rotates_by_lines_without_losing_or_splitting_one(
        out: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(manifest, "ROTATE_LINES", 5)
    stem = os.path.basename(manifest.manifest_path(str(out)))[:-len(layout.MANIFEST_SUFFIX)]
    records = [dict(OPEN, capture=str(n)) for n in range(23)]
    for record in records:
        append(str(out), record)
    names = _files(out)
    assert names == [layout.manifest_name(stem, k) for k in range(1, 6)]
    assert names[0] == f"{stem}.manifest.jsonl" and names[1] == f"{stem}.2.manifest.jsonl"
    assert [layout.manifest_part(n) for n in names] == [(stem, k) for k in range(1, 6)]
    assert manifest.manifest_path(str(out)) == str(out / "manifests" / names[-1])
    found = [(Path(out / "manifests" / n).read_bytes()) for n in names]
    assert [f.count(b"\n") for f in found] == [5, 5, 5, 5, 3]
    assert all(f.endswith(b"\n") for f in found)
    assert [json.loads(line) for f in found for line in f.splitlines()] == records


def test_a_manifest_rotates_by_bytes_and_a_line_is_never_split(
        out: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(manifest, "ROTATE_BYTES", 1000)
    records = [dict(OPEN, capture=str(n), host="h" * 200) for n in range(10)]
    records.insert(4, dict(OPEN, capture="big", host="h" * 3000))  # larger than a file
    for record in records:
        append(str(out), record)
    found = [(out / "manifests" / n).read_bytes() for n in _files(out)]
    assert all(len(f) <= 1000 or f.count(b"\n") == 1 for f in found)
    assert [json.loads(line) for f in found for line in f.splitlines()] == records
    assert [f.count(b"\n") for f in found] == [3, 1, 1, 3, 3]


def test_a_full_file_left_under_the_name_is_passed_over(out: Path, monkeypatch: Any) -> None:
    """A file this process did not write (same pid and second, an earlier state) counts
    with the lines it holds."""
    monkeypatch.setattr(manifest, "ROTATE_LINES", 3)
    first = Path(manifest.manifest_path(str(out)))
    first.parent.mkdir(parents=True)
    first.write_bytes(json.dumps(OPEN).encode() + b"\n" + b'{"event": "open"}\n' * 2)
    append(str(out), CLOSE)
    assert first.read_bytes().count(b"\n") == 3
    second = Path(manifest.manifest_path(str(out)))
    assert layout.manifest_part(second.name) == (first.name[:-len(layout.MANIFEST_SUFFIX)], 2)
    assert [json.loads(line) for line in second.read_bytes().splitlines()] == [CLOSE]


@pytest.mark.parametrize(("name", "part"), [
    ("h_pid1_20260101000000.manifest.jsonl", ("h_pid1_20260101000000", 1)),
    ("h_pid1_20260101000000.2.manifest.jsonl", ("h_pid1_20260101000000", 2)),
    ("h_pid1_20260101000000.137.manifest.jsonl", ("h_pid1_20260101000000", 137)),
    ("x.1.manifest.jsonl", ("x.1", 1)),  # never written: file 1 has no number
    ("x.02.manifest.jsonl", ("x.02", 1)),
    (".manifest.jsonl", None),
    ("h_pid1_20260101000000.jsonl", None),
])
def test_manifest_file_names_read_back(name: str, part: tuple[str, int] | None) -> None:
    assert layout.manifest_part(name) == part
    if part is not None and not part[0].endswith((".1", ".02")):
        assert layout.manifest_name(*part) == name
