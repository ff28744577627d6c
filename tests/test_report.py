"""policy-engine report: one static page of a run's captures; every capture in the grid,
ranks with one outcome in one row, failures first, operators by self time read from torch
traces as a stream, untrusted manifest text escaped, the page written whole."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policy_engine.analysis import chrome_trace, ops
from policy_engine.analysis.format import rank_spans as ranges
from policy_engine.analysis.listing import cell, collect, roles_cell
from policy_engine.analysis.report_page import CAPTURE_ROWS
from policy_engine.analysis.window_roles import families
from policy_engine.cli.main import main
from policy_engine.runtime.process.manifest import encode

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_outputs",
                                               ROOT / "benchmarks" / "bench_outputs.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

#: rank -> (step, mishap) for the small runs: every outcome a page can show.
TROUBLE = {1: (3, "failed"), 2: (2, "oom"), 3: (4, "killed"), 4: (4, "partial")}


class Page(HTMLParser):
    """The grid cells (their data- attributes), the links and the text of a page."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.cells: list[dict[str, str]] = []
        self.hrefs: list[str] = []
        self.rows: list[str] = []  # row headers of the grids
        self._in_row_head = False
        self.text: list[str] = []
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        self.tags.append((tag, found))
        if tag == "td" and "data-col" in found:
            self.cells.append(found)
        elif tag == "a":
            self.hrefs.append(found["href"])
        self._in_row_head = tag == "th" and found.get("class") == "ranks"

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._in_row_head:
            self.rows.append(data)
            self._in_row_head = False

    def covered(self) -> set[tuple[str, int | None, str]]:
        """(role, rank, step) of every capture the grid shows."""
        out: set[tuple[str, int | None, str]] = set()
        for found in self.cells:
            for part in found["data-ranks"].split(","):
                if part == "?":
                    out.add((found["data-role"], None, found["data-col"]))
                    continue
                match = re.fullmatch(r"(-?\d+)(?:-(-?\d+))?", part)
                assert match is not None, part
                first, last = int(match[1]), int(match[2] or match[1])
                out.update((found["data-role"], rank, found["data-col"])
                           for rank in range(first, last + 1))
        return out


def expected(run: Path) -> set[tuple[str, int | None, str]]:
    """(role, rank, step) of every entry `traces` lists (steps are single here)."""
    data = collect(str(run))
    return {(r["role"], r["rank"], str(r["steps"][0]))
            for r in [*data["traces"], *data["interrupted"]]}


def linked(page: Page, page_dir: Path, run: Path) -> set[str]:
    """The files the page links to, relative to the run."""
    return {os.path.relpath(os.path.normpath(page_dir / unquote(h)), run) for h in page.hrefs}


def make_report(run: Path, out: Path, *more: str) -> Page:
    assert main(["report", str(run), "-o", str(out), *more]) == 0
    return Page(out.read_text(encoding="utf-8"))


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """Twelve ranks, steps 2-4; rank 1 fails, 2 runs out of memory, 3 is killed, 4 is cut
    short; rank 0's step 2 holds a real-shaped trace."""
    run = tmp_path / "run"
    bench.make_run(str(run), ranks=12, trouble=TROUBLE)
    return run


# -- the page ---------------------------------------------------------------------

def test_every_capture_is_in_the_grid_and_links_resolve(run: Path, tmp_path: Path,
                                                         capsys: Any) -> None:
    (tmp_path / "pages").mkdir()
    page = make_report(run, tmp_path / "pages" / "r.html")
    assert "r.html (4 capture(s) need attention)" in capsys.readouterr().out
    assert page.covered() == expected(run)
    assert len(expected(run)) == 12 * 3
    traces = {r["path"] for r in collect(str(run))["traces"] if r["path"]}
    assert traces <= linked(page, tmp_path / "pages", run)
    assert all(h.startswith("./../run/") for h in page.hrefs)


def test_same_outcomes_share_a_row_and_failures_come_first(run: Path, tmp_path: Path) -> None:
    page = make_report(run, tmp_path / "r.html")
    assert page.rows == ["rank 1", "rank 2", "rank 3", "rank 4", "ranks 0,5-11 (8)"]
    text = "".join(page.text)
    attention = text[text.index("Needs attention"):]
    assert attention.index("CUPTI_ERROR_NOT_INITIALIZED") < attention.index("oom") \
        < attention.index("the process ended before the capture closed") \
        < attention.index("partial")
    statuses = {(c["data-ranks"], c["data-col"]): c["data-status"] for c in page.cells}
    assert statuses[("1", "3")] == "failed" and statuses[("2", "2")] == "oom"
    assert statuses[("3", "4")] == "interrupted" and statuses[("4", "4")] == "partial"
    assert statuses[("0,5-11", "2")] == "complete"


def test_interrupted_and_running_captures_show_as_traces_reports_them(
        run: Path, tmp_path: Path) -> None:
    now = time.strftime("%Y%m%d%H%M%S")
    live = f"{bench.host_name()}_pid{os.getpid()}_{now}.manifest.jsonl"
    (run / "manifests" / live).write_bytes(encode({
        "event": "open", "capture": "9-1", "role": "critic", "rank": 0, "world": 1,
        "steps": [7], "roles": ["critic"], "start": 1.0}))
    page = make_report(run, tmp_path / "r.html")
    statuses = {(c["data-role"], c["data-ranks"], c["data-col"]): c["data-status"]
                for c in page.cells}
    assert statuses[("critic", "0", "7")] == "running"
    assert statuses[("actor", "3", "4")] == "interrupted"
    assert "the capture is still open" in "".join(page.text)


def test_plan_and_policy_hashes_and_sizes_are_shown(run: Path, tmp_path: Path) -> None:
    make_report(run, tmp_path / "r.html")
    text = (tmp_path / "r.html").read_text()
    assert "profile_policy.yaml 6d76f6207b7d1d74" in text
    assert "<code>0000000000000001</code>" in text  # a plan hash, per capture
    size = len((run / next(p for p in os.listdir(run) if p.endswith(".gz"))).read_bytes())
    assert f">{size} B<" in text


def test_missing_files_stand_out(run: Path, tmp_path: Path) -> None:
    [gone] = run.glob("*_step3_rank5-*")
    gone.unlink()
    page = make_report(run, tmp_path / "r.html")
    text = "".join(page.text)
    assert "complete, file missing" in text and "(missing)" in text
    assert any("lost" in c["class"] and c["data-ranks"] == "5" for c in page.cells)
    assert "rank 5" in page.rows and page.rows.index("rank 5") < page.rows.index(
        "ranks 0,6-11 (7)")


def test_manifest_text_is_escaped_and_the_page_fetches_nothing(
        run: Path, tmp_path: Path) -> None:
    evil = {"event": "trace", "capture": "1-1", "status": "failed", "rank": 0, "steps": [2],
            "role": "<script>alert(1)</script>", "path": "javascript:alert(1)",
            "error": "<img src=x onerror=alert(1)>\x1b[31m", "plan_hash": '"><b>',
            "policy_file": "<link rel=stylesheet href=http://x/>"}
    (run / "manifests" / "evil_pid1_20260101000000.manifest.jsonl").write_bytes(encode(evil))
    page = make_report(run, tmp_path / "r.html")
    html_text = (tmp_path / "r.html").read_text()
    for bad in ("<script", "<img", "<link", "<b>", "url(", "@import", "\x1b"):
        assert bad not in html_text
    assert {tag for tag, _ in page.tags} <= {
        "html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "span",
        "code", "table", "tr", "th", "td", "a", "details", "summary", "section", "div",
        "ul", "li", "svg", "rect", "text", "path"}  # the analysis section's bars and the
    # step timeline's charts (a wait's hatching is a path of strokes): inline SVG
    assert all(k in ("class", "title", "href", "charset", "lang")
               or k.startswith("data-")
               or (tag in ("svg", "rect", "text") and k in ("x", "y", "width", "height"))
               or (tag == "path" and k == "d")
               for tag, attrs in page.tags for k in attrs)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html_text
    assert "./run/javascript%3Aalert%281%29" in page.hrefs  # a relative path, no scheme
    assert ("<script>alert(1)</script>", 0, "2") in page.covered()


def test_rank_ranges() -> None:
    assert ranges(r for r in [5, 0, 1, 2, None, 9, 8]) == "0-2,5,8-9,?"
    assert ranges([]) == "" and ranges([3]) == "3"


_TEXT = st.text(max_size=6) | st.sampled_from(
    ["<script>", "a&b", '"q"', "\x1b[2J", "\ud800x", "../x", "javascript:x", "-"])


@st.composite
def _records(draw: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "event": draw(st.sampled_from(["open", "trace", "trace", "close"])),
        "capture": draw(st.sampled_from(["1", "2", "3"])),
        "status": draw(st.sampled_from(["complete", "partial", "failed", "oom"])),
        "role": draw(st.none() | _TEXT), "rank": draw(st.none() | st.integers(-3, 5)),
        "steps": draw(st.lists(st.integers(0, 3) | _TEXT, max_size=3)),
        "region": draw(st.none() | _TEXT), "path": draw(st.none() | _TEXT),
        "error": draw(st.none() | _TEXT), "plan_hash": draw(_TEXT),
        "policy_file": draw(st.none() | _TEXT), "roles": draw(st.lists(_TEXT, max_size=2)),
        "bytes": draw(st.none() | st.integers(0, 1 << 40)),
        "joined": draw(st.lists(_TEXT, max_size=2))}
    if record["event"] == "close":
        record["status"] = draw(st.sampled_from(["complete", "interrupted", "failed"]))
    return record


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests=st.lists(st.lists(_records(), max_size=5), min_size=1, max_size=3))
def test_any_manifest_makes_a_page_that_shows_every_capture(
        manifests: list[list[dict[str, Any]]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        (run / "manifests").mkdir(parents=True)
        for i, records in enumerate(manifests):
            (run / "manifests" / f"far_pid{i + 1}_20260101000000.manifest.jsonl").write_bytes(
                b"".join(encode(r) for r in records))
        out = Path(tmp) / "r.html"
        assert main(["report", str(run), "-o", str(out)]) == 0
        text = out.read_text(encoding="utf-8")
        assert "\x1b" not in text and "<script" not in text
        page = Page(text)
        data = collect(str(run))
        rows = [*data["traces"], *data["interrupted"]]
        family = families(rows)  # one section per window, whatever took part per rank
        assert {(role, rank) for role, rank, _ in page.covered()} == {
            (cell(family[roles_cell(r)]), r.get("rank")) for r in rows}


# -- operators by self time -------------------------------------------------------

def chrome(*events: dict[str, Any]) -> bytes:
    return json.dumps({"schemaVersion": 1, "deviceProperties": [{"name": "traceEvents"}],
                       "traceEvents": list(events)}, indent=1).encode()


def x(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


NESTED = [
    x("ProfilerStep#1", 0, 100, cat="user_annotation"),  # nests, is not an operator
    x("aten::linear", 10, 50), x("aten::addmm", 12, 40), x("aten::copy_", 14, 5),
    x("aten::relu", 70, 20),
    x("aten::addmm", 15, 30, tid=2),  # another thread: no parent
    x("gemm", 20, 8, tid=7, cat="kernel"), x("gemm", 30, 8, tid=7, cat="kernel"),
    {"ph": "i", "name": "marker", "ts": 1}, {"ph": "X", "name": "no times"},
]


def test_self_time_is_duration_less_direct_children_on_the_same_thread() -> None:
    shuffled = NESTED[::-1]  # kineto does not promise order
    rows = ops.self_times(iter(shuffled), top=10)
    assert rows == (("aten::addmm", "cpu_op", 65.0, 2), ("aten::relu", "cpu_op", 20.0, 1),
                    ("gemm", "kernel", 16.0, 2), ("aten::linear", "cpu_op", 10.0, 1),
                    ("aten::copy_", "cpu_op", 5.0, 1))
    assert ops.self_times(iter(shuffled), top=2) == rows[:2]


@pytest.mark.parametrize("packed", [False, True])
def test_traces_are_read_as_a_stream_in_small_chunks(tmp_path: Path, packed: bool,
                                                     monkeypatch: Any) -> None:
    data = chrome(*NESTED)
    path = tmp_path / "t.pt.trace.json.gz"
    path.write_bytes(gzip.compress(data) if packed else data)
    whole = ops.read_ops(str(path), top=10, limit=1 << 20)
    monkeypatch.setattr(chrome_trace, "_CHUNK", 7)  # the key and every event cross chunks
    assert ops.read_ops(str(path), top=10, limit=1 << 20) == whole
    assert whole.rows[0] == ("aten::addmm", "cpu_op", 65.0, 2) and whole.why is None


def test_only_the_top_level_trace_events_are_read(tmp_path: Path) -> None:
    """Another top-level key that nests a traceEvents list is not the trace's events."""
    path = tmp_path / "t.pt.trace.json"
    path.write_text(json.dumps({"distributedInfo": {"traceEvents": [x("decoy", 0, 999)]},
                                "traceEvents": NESTED}))
    assert ops.read_ops(str(path), top=1, limit=1 << 20).rows == (
        ("aten::addmm", "cpu_op", 65.0, 2),)


def test_a_trace_too_large_or_broken_says_why(tmp_path: Path) -> None:
    path = tmp_path / "t.pt.trace.json"
    path.write_bytes(chrome(*NESTED))
    big = ops.read_ops(str(path), top=5, limit=100)
    assert big.rows == () and big.why == (
        "operators not read: the trace is over 100 B uncompressed (--max-trace-mb)")
    packed = tmp_path / "p.pt.trace.json.gz"
    packed.write_bytes(gzip.compress(chrome(*NESTED)))
    assert ops.read_ops(str(packed), top=5, limit=100).why == (
        "operators not read: its gzip trailer says it inflates to 1.1 KiB, over 100 B "
        "(--max-trace-mb)")
    for content, why in (
            (chrome(*NESTED)[:-40], "truncated: the file ends inside event 10 of traceEvents"),
            (chrome(*NESTED)[:-4], "truncated: the file ends inside traceEvents (after 10 "
                                   "events)"),
            (b'{"traceEvents": [{"ph": "X",}]}', "not valid JSON: Expecting property name "
             "enclosed in double quotes in event 1 of traceEvents, at character 28"),
            (b'{"other": 1}', "not a Chrome trace: it has no traceEvents array"),
            (b'{"traceEvents": [{"ts": NaN}]}',
             "NaN is not a JSON number in event 1 of traceEvents, at or after character 17"),
            (b'{"traceEvents": [{"ts": 1e400}]}', "the number 1e400 is out of range in event "
             "1 of traceEvents, at or after character 17"),
            (b'{"traceEvents": [{"ts": ' + b"9" * 5000 + b"}]}",
             "a number has too many digits in event 1 of traceEvents, at or after character "
             "17"),
            (gzip.compress(chrome(*NESTED))[:-30], "truncated: the gzip data ends early")):
        path.write_bytes(content)
        found = ops.read_ops(str(path), top=5, limit=1 << 20)
        assert found.why == f"operators not read: {why}", found
    os.mkfifo(tmp_path / "fifo")
    assert ops.read_ops(str(tmp_path / "fifo"), top=5, limit=100).why == \
        "operators not read: not a regular file"
    os.symlink(packed, tmp_path / "link.pt.trace.json.gz")
    assert ops.read_ops(str(tmp_path / "link.pt.trace.json.gz"), top=5,
                           limit=1 << 20).why == ("operators not read: cannot open it: Too "
                                                  "many levels of symbolic links")


def test_what_all_traces_read_together_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "t.pt.trace.json"
    path.write_bytes(chrome(*NESTED))
    size = len(chrome(*NESTED))
    used: list[int] = []
    assert ops.read_ops(str(path), top=1, limit=1 << 20, budget=size + 10,
                           used=used).why is None
    assert used == [size]
    assert ops.read_ops(str(path), top=1, limit=1 << 20, budget=10, used=used).why == (
        "operators not read: the traces read before it used up --max-total-mb")


def test_the_page_says_which_traces_it_read_operators_from(run: Path, tmp_path: Path) -> None:
    first = sorted(run.glob("run_actor_step2_rank0-*.pt.trace.json.gz"))[0]
    first.write_bytes(gzip.compress(chrome(*NESTED)))
    make_report(run, tmp_path / "r.html", "--ops", "3")
    text = (tmp_path / "r.html").read_text()
    assert "Operators were read from 3 of the 34 torch traces" in text
    assert text.count("top 3 operators") + text.count("top 5 operators") == 3
    make_report(run, tmp_path / "s.html", "--max-trace-mb", "0")
    text = (tmp_path / "s.html").read_text()
    assert "over 0 B (--max-trace-mb)" in text


def test_operators_of_a_real_torch_capture(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from policy_engine import Topology, profile_session

    policy = {"version": 1, "output_dir": str(tmp_path / "out"), "roles": {"trainer": {
        "enabled": True, "steps": 0, "torch": {"activities": ["cpu"]}}}}
    x = torch.randn(64, 64)
    with profile_session(policy, role="trainer", topology=Topology(rank=0, world=1)) as prof:
        for _ in range(3):
            (x @ x).relu().sum()
            prof.step()
    page = make_report(tmp_path / "out", tmp_path / "r.html")
    assert [(c["data-role"], c["data-ranks"], c["data-col"], c["data-status"])
            for c in page.cells] == [("trainer", "0", "session", "complete")]
    text = "".join(page.text)
    assert "aten::mm" in text and "aten::relu" in text and "cpu_op" in text


# -- the command ------------------------------------------------------------------

def test_usage_errors_exit_2_and_nothing_is_overwritten(run: Path, tmp_path: Path,
                                                        capsys: Any) -> None:
    out = tmp_path / "r.html"
    out.write_text("mine")
    assert main(["report", str(run), "-o", str(out)]) == 2
    assert capsys.readouterr().err == \
        f"policy-engine report: error: {out} exists (--force replaces it)\n"
    assert out.read_text() == "mine"
    assert main(["report", str(run), "-o", str(out), "--force"]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert main(["report", str(tmp_path / "nope"), "-o", str(tmp_path / "n.html")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert main(["report", str(run), "-o", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert main(["report", str(run), "-o", str(tmp_path / "no" / "r.html")]) == 2
    assert "cannot write" in capsys.readouterr().err
    assert main(["report", str(run), "--top", "x"]) == 2
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# -- at scale and in a browser (slow) ---------------------------------------------

MEASURE = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True)
sys.stdout.write(done.stdout.decode()[-2000:])
print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def measured(*argv: str) -> tuple[str, int, float]:
    """Output (the end of it), exit code and peak RSS in MB of one command."""
    done = subprocess.run([sys.executable, "-c", MEASURE, sys.executable, "-m",
                           "policy_engine", *argv], capture_output=True, text=True,
                          check=True, timeout=300)
    *text, last = done.stdout.splitlines()
    code, kib = last.split()
    return "\n".join(text), int(code), int(kib) / 1024


@pytest.mark.slow
def test_4096_ranks(tmp_path: Path) -> None:
    """The simulated 4,096-rank run (benchmarks/bench_outputs.py times it): right, and
    within a generous memory bound."""
    run = tmp_path / "run"
    entries = bench.make_run(str(run))
    assert entries == 4096 * 3 + 1
    text, code, mb = measured("traces", str(run))
    assert code == 0 and mb < 1000, (code, mb)
    assert text.splitlines()[-1] == ("12288 traces (12285 complete, 1 partial, 1 failed, "
                                     "1 oom), 1 capture interrupted")
    text, code, mb = measured("report", str(run), "-o", str(tmp_path / "r.html"))
    assert code == 0 and mb < 1000, (code, mb)
    page = Page((tmp_path / "r.html").read_text())
    assert page.covered() == expected(run)
    assert page.rows == ["rank 17", "rank 2048", "rank 4000", "rank 100",
                         "ranks 0-16,18-99,101-2047,2049-3999,4001-4095 (4092)"]
    # The listing holds CAPTURE_ROWS captures, those that need attention first; the page
    # says how many more there are and where all of them are listed.
    assert len(page.hrefs) == CAPTURE_ROWS
    troubled = [h for h in page.hrefs if h.endswith("_oom.pickle")
                or "rank17-" in h or "rank4000-" in h or "rank2048-" in h]
    assert troubled, page.hrefs[:5]
    more = 4096 * 3 + 1 - CAPTURE_ROWS
    assert (f"{more} more captures are not listed here (those that need attention come "
            "first; policy-engine traces DIR lists every one).") in "".join(page.text)


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("chromium is not on PATH (Debian: apt-get install chromium)")
    return found


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [12, 600])
def test_chromium_renders_every_capture(tmp_path: Path, ranks: int) -> None:
    browser = chromium()
    run = tmp_path / "run"
    bench.make_run(str(run), ranks=ranks, trouble=TROUBLE)
    out = tmp_path / "r.html"
    assert main(["report", str(run), "-o", str(out)]) == 0
    done = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", out.as_uri()],
        capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = Page(done.stdout)
    assert dom.covered() == expected(run)
    assert len(dom.rows) == 5
    paths = {r["path"] for r in collect(str(run))["traces"] if r["path"]}
    assert paths <= linked(dom, tmp_path, run)
