"""The report's step timeline (analysis/report_gantt.py): one Gantt chart per profiled step
with who waits for whom under it, names escaped, the page bounded; and what headless
Chromium draws of it (a screenshot, its pixels read back)."""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
import zlib
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from timeline_runs import make_rl_run, phase, rl_step

from policy_engine.analysis import report_gantt
from policy_engine.analysis.run import analyze_run
from policy_engine.cli.main import main


def timeline_of(root: Path) -> dict[str, Any]:
    result = analyze_run(str(root))
    result.close()
    return dict(result.timeline or {})


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rl")
    make_rl_run(str(root), 4, {3: rl_step(), 4: rl_step()}, skew={3: 2000.0})
    return root


def test_each_step_is_a_chart_with_who_waits_for_whom_under_it(run: Path) -> None:
    page = report_gantt.section(timeline_of(run))
    assert page.count('<svg class="gantt"') == 2
    assert page.count('<text class="row"') == 4  # actor+ref ranks 0-1, rollout ranks 2-3
    assert ">actor+ref ranks 0-1<" in page and ">rollout ranks 2-3<" in page
    # generate, the ref, the update and the sync, outlined on the critical path
    assert page.count(' critical" x=') == 2 * 4
    assert page.count('<path class="wait"') >= 4  # the actor's wait, the rollout's lead
    assert ("<li>ranks 0-1 (actor+ref) wait 60% of step 3 (600.0 ms) while ranks 2-3 "
            "(rollout) run generate_sequences</li>") in page
    assert ("Critical path: generate_sequences (rollout 2-3) \u2192 ref_compute_log_prob "
            "(actor+ref 0-1) \u2192 actor_update (actor+ref 0-1) \u2192 sync_weights "
            "(rollout 2-3)") in page
    for bad in ("<script", "url(", "href", "style="):
        assert bad not in page


def test_names_are_escaped_and_steps_past_the_bound_are_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    evil = "<script>alert(1)</script>\x1b"
    make_rl_run(str(tmp_path), 1, {n: {0: ("trainer", [phase(evil, 0, 5)], (0.0, 10.0))}
                                   for n in (1, 2, 3)})
    monkeypatch.setattr(report_gantt, "MAX_DRAWN", 2)
    page = report_gantt.section(timeline_of(tmp_path))
    assert "<script" not in page and "\x1b" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\x1b" in page
    assert page.count('<svg class="gantt"') == 2
    assert "1 more steps are not drawn" in page


def test_a_run_without_phases_draws_no_timeline() -> None:
    assert report_gantt.section({"clock": None, "steps": [], "notes": []}) == ""
    assert report_gantt.section(None) == ""


def read_png(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and rows (RGB bytes) of an 8-bit RGB or RGBA PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, idat, header = 8, b"", b""
    while at < len(data):
        size, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + size]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        at += 12 + size
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour in (2, 6)
    step = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * step
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        at = y * (stride + 1)
        kind, line = raw[at], bytearray(raw[at + 1:at + 1 + stride])
        for i in range(stride):
            left = line[i - step] if i >= step else 0
            up, corner = previous[i], previous[i - step] if i >= step else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                near = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[i] = (line[i] + near) & 255
        previous = line
        rows.append(bytes(b for i, b in enumerate(line) if i % step < 3))
    return width, height, rows


def test_headless_chromium_draws_the_chart(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    with redirect_stdout(io.StringIO()):
        assert main(["report", str(run), "-o", str(out)]) == 0
    page = out.read_text()
    assert page.count('<svg class="gantt"') == 2
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not on PATH (Debian: apt-get install chromium)")
    # the timeline alone, so that its charts are on the screenshot
    alone = tmp_path / "timeline.html"
    alone.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>"
                     + report_gantt.section(timeline_of(run)) + "</body></html>")
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu",
             "--force-device-scale-factor=1"]
    dom = subprocess.run([*flags, "--dump-dom", out.as_uri()], capture_output=True,
                         text=True, timeout=180).stdout
    assert dom.count('<svg class="gantt"') == 2 and "Critical path:" in dom
    shot = tmp_path / "timeline.png"
    subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1000,800",
                    alone.as_uri()], capture_output=True, timeout=180)
    width, height, rows = read_png(shot)
    assert (width, height) == (1000, 800)
    counts = {colour: 0 for colour in report_gantt.PALETTE[:4]}
    wanted = {bytes.fromhex(c[1:]): c for c in counts}
    for line in rows:
        for x in range(0, len(line), 3):
            found = wanted.get(line[x:x + 3])
            if found is not None:
                counts[found] += 1
    # each phase's colour fills its bars: the four phases of the first step, at least
    assert all(n > 400 for n in counts.values()), counts
