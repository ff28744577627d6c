"""Names from a run's manifests and traces never reach a terminal as they are: every
reading command (analyze, compare, traces, merge, report, explain --sizes-from) shows a
control character or an ANSI escape sequence in a role, region, operator, backend, error,
mesh or path as its escape (``\\x1b``), on one line.

A name such as ``\\x1b[1A\\x1b[2K...`` would otherwise move the cursor and write over what
the command printed: a comparison saying "slower +838%" shown as "faster -41%".
"""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from analysis_traces import trace_events

from policy_engine.cli.main import main
from policy_engine.errors import printable
from policy_engine.files.layout import MANIFEST_DIR
from policy_engine.runtime.process.manifest import encode

ESC = "\x1b"
#: Each name carries a sequence that rewrites a terminal's line, and a line break.
ROLE = f"act{ESC}[1A{ESC}[2Kor"
REGION = f"upd{ESC}[31mate\nnext"
OP = f"aten::{ESC}[2Jmm"
SPAN = f"upd{ESC}]0;titled{ESC}\\ate_actor"
BACKEND = f"nsys{ESC}[0m"
ERROR = f"it failed{ESC}[1A: faster -41%"
DIM = f"d{ESC}[5mp"
FOLDER = f"st{ESC}[7mep1"
#: Anything a terminal acts on: C0 and C1 controls but the line breaks between lines.
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def _trace(path: Path, rank: int, slow: bool, base_time: bool) -> None:
    events = trace_events(rank, 2, steps=9, ops=4, compute_us=8000.0 if slow else 5000.0)
    for event in events:
        if event.get("name") == "update_actor":
            event["name"] = SPAN
        elif event.get("name") == "aten::relu":
            event["name"] = OP
    doc: dict[str, Any] = {"traceEvents": events}
    if base_time:
        doc["baseTimeNanoseconds"] = 1790000000000000000
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def hostile_run(root: Path, *, slow: bool = False, spread: int = 1) -> Path:
    """Two ranks of one window whose every name is hostile, a third rank whose trace line
    failed, a file of another backend, and a second role. ``spread``: the ranks' place
    along the mesh's one dimension is ``rank * spread``."""
    lines = []
    for rank in range(2):
        rel = f"{ROLE}/{FOLDER}/rank{rank}.pt.trace.json"
        _trace(root / rel, rank, slow, base_time=rank == 0)
        lines.append({"event": "trace", "capture": f"{rank}-1", "role": ROLE,
                      "roles": [ROLE], "rank": rank, "world": 3, "steps": [1],
                      "cycle": 0, "region": REGION, "status": "complete",
                      "backend": "torch", "path": rel, "start": 1.0 + rank, "bytes": 1000,
                      "coords": {DIM: rank * spread}, "torch": f"2.5{ESC}[8m",
                      "policy_hash": f"{ESC}[31mabc" if slow else "abc"})
    lines.append({"event": "trace", "capture": "2-1", "role": ROLE, "roles": [ROLE],
                  "rank": 2, "world": 3, "steps": [1], "cycle": 0, "region": REGION,
                  "status": "failed", "backend": "torch", "error": ERROR, "start": 3.0})
    lines.append({"event": "trace", "capture": "0-1", "role": ROLE, "roles": [ROLE],
                  "rank": 0, "world": 3, "steps": [1], "cycle": 0, "region": REGION,
                  "status": "complete", "backend": BACKEND, "start": 1.5,
                  "path": f"{ROLE}/{FOLDER}/x{ESC}[2J.nsys-rep", "bytes": 10})
    (root / ROLE / FOLDER / f"x{ESC}[2J.nsys-rep").write_bytes(b"x" * 10)
    lines.append({"event": "trace", "capture": "9-1", "role": f"cri{ESC}[2Jtic",
                  "rank": 0, "world": 1, "steps": [1], "status": "complete",
                  "backend": "torch", "path": f"c{ESC}[2J.pt.trace.json", "start": 9.0})
    (root / MANIFEST_DIR).mkdir(parents=True, exist_ok=True)
    (root / MANIFEST_DIR / "h_pid1_20260101000000.manifest.jsonl").write_bytes(
        b"".join(encode(line) for line in lines))
    return root


def run(*argv: Any) -> tuple[int, str]:
    """A command's exit code and everything it printed (stdout, then stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue() + err.getvalue()


def shown_escaped(text: str, *names: str) -> None:
    """No control character in ``text`` but line breaks, and each of ``names`` in it as
    its escape (shown, not dropped)."""
    assert not CONTROL.search(text), [line for line in text.splitlines()
                                      if CONTROL.search(line)]
    for name in names:
        assert printable(name) in text, (printable(name), text)


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    return hostile_run(tmp_path / "base"), hostile_run(tmp_path / "new", slow=True)


def test_analyze_shows_every_name_escaped(runs: tuple[Path, Path]) -> None:
    _, new = runs
    code, text = run("analyze", new)
    assert code == 0
    shown_escaped(text, ROLE, REGION, SPAN, ERROR)
    code, text = run("analyze", new, "--role", "nobody")
    assert code == 2
    shown_escaped(text, ROLE)


def test_compare_shows_every_name_escaped(runs: tuple[Path, Path]) -> None:
    base, new = runs
    code, text = run("compare", base, new)
    assert code == 0
    assert "verdict: slower" in text
    shown_escaped(text, ROLE, REGION, SPAN, OP, ERROR)
    code, text = run("compare", base, hostile_run(base.parent / "wide", spread=2))
    assert code == 0 and "differs: mesh" in text
    shown_escaped(text, DIM)
    code, text = run("compare", base, new, "--role", "nobody")
    assert code == 2
    shown_escaped(text, ROLE)


def test_a_comparison_that_pairs_nothing_names_the_windows_escaped(tmp_path: Path) -> None:
    base = hostile_run(tmp_path / "base")
    other = tmp_path / "other"
    (other / MANIFEST_DIR).mkdir(parents=True)
    _trace(other / "t.pt.trace.json", 0, False, True)
    (other / MANIFEST_DIR / "h_pid1_20260101000000.manifest.jsonl").write_bytes(encode(
        {"event": "trace", "role": f"x{ESC}[2Jy", "rank": 0, "steps": [1],
         "status": "complete", "backend": "torch", "path": "t.pt.trace.json"}))
    code, text = run("compare", base, other)
    assert code == 2 and "no window of BASE matches one of NEW" in text
    shown_escaped(text, ROLE, f"x{ESC}[2Jy")


def test_traces_shows_every_name_escaped(runs: tuple[Path, Path]) -> None:
    _, new = runs
    code, text = run("traces", new)
    assert code == 0
    shown_escaped(text, ROLE, REGION, ERROR, FOLDER)


def test_merge_shows_every_name_escaped(runs: tuple[Path, Path], tmp_path: Path) -> None:
    _, new = runs
    code, text = run("merge", new, "-o", tmp_path / "m.json")
    assert code == 2 and "choose one with --role" in text
    shown_escaped(text, ROLE)
    code, text = run("merge", new, "--role", ROLE, "-o", tmp_path / "m.json")
    assert code == 0
    assert "has no baseTimeNanoseconds" in text and "skipped" in text
    shown_escaped(text, ROLE, REGION, FOLDER, BACKEND, ERROR)
    code, text = run("merge", new, "--role", ROLE, "--step", "5", "-o", tmp_path / "n.json")
    assert code == 2
    shown_escaped(text, ROLE, REGION)


def test_the_report_shows_every_name_escaped(runs: tuple[Path, Path], tmp_path: Path) -> None:
    base, new = runs
    page = tmp_path / "r.html"
    code, text = run("report", new, "-o", page, "--baseline", base)
    assert code == 0
    shown_escaped(text)
    html = page.read_text()
    assert "slower" in html
    shown_escaped(html, ROLE, SPAN, OP, ERROR)


def test_explain_sizes_from_shows_no_name_of_the_run(runs: tuple[Path, Path],
                                                     tmp_path: Path) -> None:
    _, new = runs
    policy = tmp_path / "p.yaml"
    policy.write_text("version: 1\nroles:\n  actor:\n    enabled: true\n    ranks: all\n"
                      "    steps: \"1-10\"\n    limits: {bytes: 1KB}\n")
    code, text = run("explain", policy, "--role", "actor", "--world", "2", "--sizes-from",
                     new)
    assert code == 0
    assert "median of 2 torch traces of other roles (none of 'actor')" in text
    shown_escaped(text)
    code, text = run("validate", policy, "--sizes-from", new)
    assert code == 0 and "exceeds limits.bytes" in text
    shown_escaped(text)
