"""policy-engine traces: manifests of every process merged; strays, gaps, captures that never
closed, half-written saves and damaged manifest lines flagged; never a crash."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policy_engine.cli.main import main
from policy_engine.files.layout import host_name

STAMP = time.strftime("%Y%m%d%H%M%S")
#: A manifest name whose process is not on this host: its open captures are interrupted.
AWAY = f"otherhost_pid4242_{STAMP}"


def here(pid: int = os.getpid(), stamp: str = STAMP) -> str:
    """A manifest name for process ``pid`` on this host."""
    return f"{host_name()}_pid{pid}_{stamp}"


def common(rank: int, steps: list[int], start: float) -> dict[str, Any]:
    return {"role": "actor", "region": None, "rank": rank, "world": 2, "coords": {},
            "local_rank": rank, "node": 0, "backend": "torch", "steps": steps,
            "plan_hash": "p", "policy_file": None, "policy_hash": "h",
            "policy_file_hash": None, "pid": 4242, "start": start}


def opened(capture: str, rank: int, steps: list[int], start: float) -> dict[str, Any]:
    return {"event": "open", "capture": capture, "roles": ["actor"], "thread": "MainThread",
            "host": "h", **common(rank, steps, start)}


def trace(capture: str | None, rank: int, steps: list[int], start: float, path: str | None,
          status: str = "complete", **more: Any) -> dict[str, Any]:
    record = {"event": "trace", "capture": capture, **common(rank, steps, start),
              "path": path, "bytes": 1234 if path else None, "cycle": 0, "inner_steps": [0],
              "joined": [], "status": status, "end": start + 1, **more}
    if capture is None:  # a line written before records had an event and a capture id
        del record["event"], record["capture"]
    return record


def closed(capture: str, status: str = "complete", traces: int = 1,
           **more: Any) -> dict[str, Any]:
    return {"event": "close", "capture": capture, "status": status, "end": 99.0,
            "traces": traces, **more}


def write_manifest(out: Path, name: str, *records: dict[str, Any] | bytes) -> Path:
    path = out / "manifests" / f"{name}.manifest.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        for r in records:
            f.write(r if isinstance(r, bytes) else json.dumps(r).encode() + b"\n")
    return path


def trace_file(out: Path, rank: int, step: int) -> str:
    name = f"t_actor_step{step}_rank{rank}-of-2.rec"
    (out / name).parent.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(name)
    return name


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """Rank 0 profiled steps 1 and 2 (one old-style line), rank 1 step 2."""
    out = tmp_path / "out"
    write_manifest(out, "h0_pid10_20260101000000",
                   trace(None, 0, [1], 1.0, trace_file(out, 0, 1)),
                   opened("10-2", 0, [2], 2.0),
                   trace("10-2", 0, [2], 2.0, trace_file(out, 0, 2)),
                   closed("10-2"))
    write_manifest(out, "h1_pid11_20260101000000",
                   opened("11-1", 1, [2], 2.0),
                   trace("11-1", 1, [2], 2.0, trace_file(out, 1, 2)),
                   closed("11-1"))
    return out


def run_json(out: Path, capsys: Any) -> dict[str, Any]:
    assert main(["traces", str(out), "--format", "json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def run_text(out: Path, capsys: Any) -> str:
    assert main(["traces", str(out)]) == 0
    text: str = capsys.readouterr().out
    return text


def test_rows_from_every_manifest(out: Path, capsys: Any) -> None:
    data = run_json(out, capsys)
    assert [(r["role"], r["rank"], r["steps"], r["status"]) for r in data["traces"]] == [
        ("actor", 0, [1], "complete"), ("actor", 0, [2], "complete"),
        ("actor", 1, [2], "complete")]
    assert all(r["exists"] for r in data["traces"])
    assert {k: v for k, v in data.items() if k != "traces"} == {
        "interrupted": [], "unlisted": [], "missing": [], "leftovers": [], "writing": [],
        "bad_lines": [], "unreadable": []}


def test_strays_and_missing_files_are_flagged(out: Path, capsys: Any) -> None:
    first = sorted(p for p in out.iterdir() if p.suffix == ".rec")[0]
    first.unlink()
    (out / "someone_else.pt.trace.json").write_text("{}")
    (out / "sub").mkdir()
    (out / "sub" / "stray.nsys-rep").write_text("")
    data = run_json(out, capsys)
    assert data["missing"] == [first.name]
    assert data["unlisted"] == ["someone_else.pt.trace.json", os.path.join("sub", "stray.nsys-rep")]
    text = run_text(out, capsys)
    assert f"missing: {first.name} (a manifest names it, but it is not on disk)" in text
    assert "unlisted: someone_else.pt.trace.json (on disk, but no manifest names it)" in text
    assert "3 traces (3 complete)" in text


def test_not_a_folder_is_a_usage_error(tmp_path: Path, capsys: Any) -> None:
    assert main(["traces", str(tmp_path / "nope")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_a_capture_that_never_closed_is_interrupted(out: Path, capsys: Any) -> None:
    write_manifest(out, AWAY, opened("1", 1, [5, 6], 50.0),
                   trace("1", 1, [5, 6], 50.0, trace_file(out, 1, 5)))
    data = run_json(out, capsys)
    [row] = data["interrupted"]
    assert (row["status"], row["role"], row["rank"], row["steps"], row["traces"]) == (
        "interrupted", "actor", 1, [5, 6], 1)
    assert row["reason"] == "the process ended before the capture closed"
    assert row["manifest"] == os.path.join("manifests", f"{AWAY}.manifest.jsonl")
    text = run_text(out, capsys)
    lines = text.splitlines()
    assert lines[0].split() == ["ROLE", "REGION", "RANK", "STEPS", "CYCLE", "STATUS", "SIZE",
                                "PATH"]
    assert lines[5].split(None, 7) == [
        "actor", "-", "1", "5-6", "-", "interrupted", "-",
        "(the process ended before the capture closed)"]
    assert "4 traces (4 complete), 1 capture interrupted" in text


def test_a_dead_process_on_this_host_is_interrupted(out: Path, capsys: Any) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    write_manifest(out, here(child.pid), opened("1", 0, [7], 70.0))
    assert run_json(out, capsys)["interrupted"][0]["status"] == "interrupted"


def test_a_capture_open_in_a_live_process_is_running(out: Path, capsys: Any) -> None:
    write_manifest(out, here(), opened("1", 0, [7], 70.0))
    temp = f".policy-engine-{os.getpid()}-{'a' * 32}.tmp.rec"
    (out / temp).write_text("")
    data = run_json(out, capsys)
    [row] = data["interrupted"]
    assert (row["status"], row["reason"]) == ("running", "the capture is still open")
    assert data["writing"] == [temp] and data["leftovers"] == [] and data["unlisted"] == []
    text = run_text(out, capsys)
    assert "3 traces (3 complete), 1 capture running" in text
    assert f"writing: {temp} (a save in progress)" in text


def test_a_reused_pid_is_not_taken_for_the_writer(out: Path, capsys: Any) -> None:
    """A manifest begun before this process started was written by another process."""
    if not os.path.exists(f"/proc/{os.getpid()}/stat"):
        pytest.skip("needs /proc")
    write_manifest(out, here(stamp="20000101000000"), opened("1", 0, [7], 70.0))
    assert run_json(out, capsys)["interrupted"][0]["status"] == "interrupted"


def test_a_close_that_says_interrupted_shows_its_error(out: Path, capsys: Any) -> None:
    error = "SIGTERM while thread loader-3 owned the capture"
    write_manifest(out, AWAY, opened("1", 0, [8], 80.0),
                   closed("1", "interrupted", traces=0, error=error))
    data = run_json(out, capsys)
    assert [(r["status"], r["reason"]) for r in data["interrupted"]] == [("interrupted", error)]
    [row] = [line for line in run_text(out, capsys).splitlines() if "interrupted " in line]
    assert row.split(None, 7)[5:] == ["interrupted", "-", f"({error})"]


def test_traces_a_close_counts_that_never_reached_the_manifest(out: Path, capsys: Any) -> None:
    write_manifest(out, AWAY, opened("1", 0, [8], 80.0),
                   trace("1", 0, [8], 80.0, trace_file(out, 0, 8)), closed("1", traces=2),
                   opened("2", 0, [9], 90.0), closed("2", traces=0, deferred=1),
                   opened("3", 0, [9], 91.0), closed("3", traces=0, thread_waits=2))
    data = run_json(out, capsys)
    # deferred (older manifests) and thread_waits count waits for a thread, not files.
    assert [(r["capture"], r["reason"]) for r in data["interrupted"]] == [
        ("1", "1 of its 2 trace(s) never reached the manifest")]


def test_leftover_temporary_files_are_listed_not_unlisted(out: Path, capsys: Any) -> None:
    (out / "sub").mkdir()
    temp = os.path.join("sub", ".policy-engine-99999999-0123456789abcdef.tmp.pt.trace.json.gz")
    (out / temp).write_text("half")
    data = run_json(out, capsys)
    assert data["leftovers"] == [temp] and data["unlisted"] == []
    assert f"leftover: {temp} (an interrupted save; safe to delete)" in run_text(out, capsys)


def test_bad_lines_are_reported_with_file_and_line(out: Path, capsys: Any) -> None:
    path = write_manifest(out, AWAY, b'{"status": "complete", "rank": "zero"}\n', b"\xff\xfe\n",
                          trace("1", 0, [3], 3.0, None, "failed", error="boom"),
                          b'{"role": "actor", "rank": 0, "pa')  # a crash mid-write
    data = run_json(out, capsys)
    assert len(data["traces"]) == 4
    assert [(b["manifest"], b["line"]) for b in data["bad_lines"]] == [
        (str(path), 1), (str(path), 2), (str(path), 4)]
    text = run_text(out, capsys)
    assert f'bad manifest line: {path}:1: rank: expected an integer or null, got "zero"' in text
    assert f"bad manifest line: {path}:2: not UTF-8 (byte 0xff at column 1)" in text
    assert f"bad manifest line: {path}:4: half a line at the end of the file" in text
    [row] = [line for line in text.splitlines() if "failed " in line]
    assert row.split(None, 7)[5:] == ["failed", "-", "(boom)"]


def test_surrogates_and_control_characters_never_break_the_output(
        out: Path, capsys: Any) -> None:
    write_manifest(out, AWAY, b'{"status": "complete", "role": "a\\ud800\\u001b[31m", '
                              b'"path": "p\\udcff\\n.rec", "error": "\\udfff"}\n')
    (out / os.fsdecode(b"stray\xff.rec")).write_text("")
    data = run_json(out, capsys)
    assert any(r["role"] == "a\ufffd\x1b[31m" for r in data["traces"])
    text = run_text(out, capsys)
    assert "\x1b" not in text and "a\ufffd\\x1b[31m" in text
    assert "unlisted: stray\\xff.rec" in text


def test_unreadable_manifests_are_reported(out: Path, capsys: Any) -> None:
    os.mkfifo(out / "manifests" / "x.manifest.jsonl")
    data = run_json(out, capsys)
    assert data["unreadable"] == [{"path": str(out / "manifests" / "x.manifest.jsonl"),
                                   "why": "not a regular file"}]
    assert "unreadable: " in run_text(out, capsys)


# -- whatever the manifests hold, traces reports and exits 0 -------------------------------

_FIELDS = ["event", "capture", "role", "roles", "region", "rank", "world", "cycle", "pid",
           "path", "bytes", "steps", "inner_steps", "joined", "start", "end", "status",
           "error", "traces", "deferred", "thread_waits", "coords", "extra", "local_rank"]
_scalars = (st.none() | st.booleans() | st.integers() | st.integers(-2**70, 2**70)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
            | st.sampled_from(["\ud800", "a\udfffb", "\x1b[2J", "open", "trace", "close",
                               "complete", "partial", "failed", "interrupted", "1", "../x",
                               "/etc/passwd", "a\x00b"]))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)
_records = st.dictionaries(st.sampled_from(_FIELDS), _values, max_size=10)


@st.composite
def _lines(draw: Any) -> bytes:
    kind = draw(st.sampled_from(["record", "record", "bytes", "valid"]))
    if kind == "bytes":
        return bytes(draw(st.binary(max_size=80)))
    record = draw(_records)
    if kind == "valid":
        record.update(event=draw(st.sampled_from(["open", "trace", "close"])),
                      capture=draw(st.sampled_from(["1", "2"])),
                      status=draw(st.sampled_from(["complete", "interrupted", "failed"])))
    ascii_only = draw(st.booleans())
    text = json.dumps(record, ensure_ascii=ascii_only)
    return text.encode("utf-8", "surrogatepass")


def _strict(text: str) -> Any:
    def reject(name: str) -> None:
        raise ValueError(name)
    return json.loads(text, parse_constant=reject)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests=st.lists(st.lists(_lines(), max_size=6), min_size=1, max_size=3),
       newline_at_end=st.booleans())
def test_any_manifest_content_is_reported_never_a_crash(
        manifests: list[list[bytes]], newline_at_end: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        names = [AWAY, here(), "junk"]
        for name, lines in zip(names, manifests, strict=False):
            body = b"\n".join(lines) + (b"\n" if newline_at_end else b"")
            write_manifest(out, name, body)
        for fmt in ("text", "json"):
            stdout, stderr = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                code = main(["traces", tmp, "--format", fmt])
            assert code == 0, stderr.getvalue()
            assert "Traceback" not in stderr.getvalue() + stdout.getvalue()
            if fmt == "json":
                data = _strict(stdout.getvalue())
                json.dumps(data).encode("utf-8")  # no lone surrogates
            else:
                stdout.getvalue().encode("utf-8")
                assert "\x1b" not in stdout.getvalue()


@pytest.mark.slow
def test_demo_runs_and_lists_its_traces(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "policy_engine", "demo", "--world", "1",
                           "--out", str(tmp_path / "demo")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "actor+ref+rollout" in done.stdout and "2 traces (2 complete)" in done.stdout
    assert "actor+ref+rollout/step2/" in done.stdout  # colocate: every role, policy order
    traces = sorted((tmp_path / "demo").rglob("*.pt.trace.json.gz"))
    assert [t.parent.name for t in traces] == ["step2", "step3"]
    assert "ui.perfetto.dev" in done.stdout and "tensorboard" not in done.stdout.lower()
    assert "not profiled" not in done.stdout  # the example's ranks all fit in one process
    assert "in one process" in done.stdout and not (tmp_path / "demo" / ".demo-job.log").exists()
    # The built-in example has no file: the manifests and the report name it instead.
    lines = [json.loads(line) for m in (tmp_path / "demo" / "manifests").iterdir()
             for line in m.read_text().splitlines()]
    assert {r["policy_file"] for r in lines if "policy_file" in r} == {
        "built-in verl_ppo.yaml"}
    page = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "demo"), "-o", str(page)]) == 0
    text = page.read_text()
    assert "<code>built-in verl_ppo.yaml" in text and "(a mapping)" not in text


def test_demo_says_which_ranks_of_a_policy_its_one_process_leaves_out() -> None:
    from policy_engine import load_policy
    from policy_engine.cli.demo import past_the_world

    policy = load_policy({"version": 1, "defaults": {"enabled": True, "steps": [2]},
                          "roles": {"actor": {"ranks": "0-3"}, "critic": {"ranks": [2, 5]},
                                    "ref": {"ranks": [0, -1]}, "trainer": {"ranks": 7}}})
    assert past_the_world(policy, ("rollout", "actor", "ref", "critic")) == [
        "role actor selects ranks 0-3, but the demo runs one process, rank 0 of 1: ranks "
        "past 0 are not profiled",
        "role critic selects ranks [2, 5], but the demo runs one process, rank 0 of 1: "
        "ranks past 0 are not profiled (role critic profiles nothing here)"]
