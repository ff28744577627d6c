"""The report's analysis section: why each capture exists, the bars with the straggler
marked, bounded size at 4,096 ranks, and what headless Chromium renders of it."""

from __future__ import annotations

import html
import io
import re
import shutil
import subprocess
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from analysis_traces import make_run

from policy_engine.analysis.report_analysis import MAX_BARS, section, svg
from policy_engine.cli.main import main
from policy_engine.files.layout import MANIFEST_DIR
from policy_engine.runtime.process.manifest import encode


def _rank(rank: int, compute: float, comm: float, idle: float = 100.0) -> dict[str, Any]:
    return {"rank": rank, "total": {"time_us": compute + comm + idle, "compute_us": compute,
                                    "comm_us": comm, "overlap_us": 0.0, "other_us": 0.0,
                                    "idle_us": idle, "span_us": compute + comm + idle}}


def test_bars_one_per_rank_with_the_straggler_marked() -> None:
    drawn = svg([_rank(0, 1000, 5000), _rank(1, 5000, 1000), _rank(2, 1000, 5000)], 1)
    assert drawn.count("<text") == 4 and drawn.count('class="outline"') == 1
    assert "rank 1: compute 5.0 ms" in drawn and "rank 0: communication 5.0 ms" in drawn


def test_4096_ranks_are_grouped_into_a_bounded_drawing() -> None:
    ranks = [_rank(r, 1000 + (r % 3), 5000) for r in range(4096)]
    ranks[77] = _rank(77, 6000, 100)
    ranks[3000] = _rank(3000, 1000, 2000)  # an outlier of its own
    drawn = svg(ranks, 77)
    labels = re.findall(r'<text class="label[^"]*" x="0" y="\d+">([^<]*)<title>', drawn)
    assert labels[0] == "rank 77" and len(labels) == 3 <= MAX_BARS
    assert html.unescape(labels[1]).startswith("4094 ranks 0-76,78-") and labels[2] == \
        "rank 3000"
    assert len(drawn) < 4000
    many = svg([_rank(r, 100.0 * r, 5000) for r in range(4096)], None)
    assert many.count("<text") <= MAX_BARS


def test_why_each_capture_exists_limits_and_dropped_backends(tmp_path: Path) -> None:
    make_run(str(tmp_path), 2, trigger="on_demand", request="req-42", slow=1, extra_us=3000.0,
             notes=[{"note": "limit", "message": "limits.bytes: 9 bytes written", "rank": 1}])
    failed = {"event": "trace", "capture": "10000-1", "role": "trainer", "roles": ["trainer"],
              "rank": 0, "world": 2, "steps": [1], "cycle": 0, "status": "failed",
              "backend": "memory", "path": None, "start": 2.0, "trigger": "on_demand",
              "error": "no CUDA device: memory history needs one"}
    with open(tmp_path / MANIFEST_DIR / "node0_pid10000_20261202000000.manifest.jsonl",
              "ab") as f:
        f.write(encode(failed))
    page = section(str(tmp_path))
    assert "Captured because of on demand (request req-42)" in page
    assert "backend memory wrote nothing on rank(s) 0: no CUDA device" in page
    assert "trainer rank 1: limits.bytes: 9 bytes written" in page
    assert 'Straggler: <span class="who">rank 1</span> in 3 of 3 steps' in page
    assert "<script" not in page


def test_the_report_page_holds_the_section(tmp_path: Path) -> None:
    make_run(str(tmp_path / "run"), 4, windows=2, slow=3, extra_us=3000.0)
    out = tmp_path / "report.html"
    with redirect_stdout(io.StringIO()):
        assert main(["report", str(tmp_path / "run"), "-o", str(out)]) == 0
    page = out.read_text()
    assert page.count('<div class="window">') == 2 and page.count('class="outline"') == 2
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not on PATH (Debian: apt-get install chromium)")
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu"]
    dom = subprocess.run([*flags, "--dump-dom", out.as_uri()], capture_output=True,
                         text=True, timeout=180).stdout
    # the windows' bars (the step timeline above them draws its own charts)
    assert dom.count("<svg class=\"bars\"") == 2 and dom.count("\u25c0 straggler") == 2
    assert dom.count("<svg class=\"calls\"") == 2  # each window's collectives
    assert "ProfilerStep" in dom and "no_kernels" in dom
    shot = tmp_path / "report.png"
    subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1000,1400", out.as_uri()],
                   capture_output=True, timeout=180)
    assert shot.stat().st_size > 10_000


def test_the_report_reads_a_bounded_number_of_traces(tmp_path: Path) -> None:
    make_run(str(tmp_path), 4, windows=3, trigger="signal")
    page = section(str(tmp_path), max_traces=5)
    assert page.count('<div class="window">') == 3 and page.count('<svg class="bars"') == 1
    assert page.count("not analysed here: over the 5 traces read") == 2
    assert page.count("Captured because of a signal (SIGUSR2)") == 3


def test_the_report_reads_each_manifest_once_for_its_listing_and_its_analysis(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's listing and its analysis section take their lines from one reading of
    the manifests; a summary's figures are read again by its place alone. The page says
    what reading them twice said: every capture listed, the straggler named, a damaged
    line reported."""
    from analysis_traces import make_summarised_run

    from policy_engine.analysis import manifests

    make_summarised_run(str(tmp_path / "run"), 8, steps=3, ops=20, gpu=True, extra_us=2000.0)
    damaged = sorted((tmp_path / "run" / MANIFEST_DIR).iterdir())[0]
    with damaged.open("ab") as f:
        f.write(b'{"event": "trace", "status": 7}\n')
    opened: list[str] = []
    real = manifests._read_file

    def counted(path: str, *args: Any, **kwargs: Any) -> Any:
        opened.append(path)
        return (yield from real(path, *args, **kwargs))

    monkeypatch.setattr(manifests, "_read_file", counted)
    page = tmp_path / "page.html"
    with redirect_stdout(io.StringIO()):
        assert main(["report", str(tmp_path / "run"), "-o", str(page)]) == 0
    assert sorted(opened) == sorted(str(p) for p in (tmp_path / "run" / MANIFEST_DIR).iterdir())
    text = page.read_text()
    assert "8 capture(s) on 8 rank(s)" in text
    assert 'Straggler: <span class="who">rank 1</span>' in text
    assert "status: expected one of complete, partial, failed, oom, got 7" in text
