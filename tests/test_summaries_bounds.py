"""Summaries within bounds: the worker holds its memory and its output to fixed sizes
(analysis.summarize_main), the training process reads a bounded amount of whatever a
worker prints (runtime.process.summaries), and report's analysis reads traces under its
limits."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from analysis_traces import make_run, stream_trace, write_trace

from policy_engine.analysis import analyze, summarize
from policy_engine.analysis import summary as summary_module
from policy_engine.analysis.manifests import scan_manifests
from policy_engine.analysis.summary import problem
from policy_engine.cli.main import main
from policy_engine.runtime.process import summaries

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
SCHEMA = json.loads((ROOT / "schemas" / "analysis.schema.json").read_text())


def worker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", summaries.WORKER, *args], capture_output=True,
                          text=True, env=ENV, timeout=300)


def test_a_summary_lists_the_first_steps_and_counts_the_rest(
        tmp_path: Path, monkeypatch: Any) -> None:
    """Steps in any order in the file: the first ones by start are listed, with the figures
    they have when every step is listed (the last one's GPU window ends where the next step
    starts), and the others are counted."""
    path = tmp_path / "t.pt.trace.json"
    write_trace(str(path), 0, 2, steps=30, ops=6, gpu=True)
    doc = json.loads(path.read_text())
    random.Random(7).shuffle(doc["traceEvents"])
    path.write_text(json.dumps(doc))
    whole = summarize(str(path))
    assert len(whole["steps"]) == 30 and "steps_left_out" not in whole["facts"]
    monkeypatch.setattr(summary_module, "MAX_SUMMARY_STEPS", 10)
    cut = summarize(str(path))
    assert cut["steps"] == whole["steps"][:10]
    assert cut["facts"]["steps_left_out"] == 20 and cut["facts"]["profiler_steps"] == 30
    assert cut["gpu_timeline"] == whole["gpu_timeline"] and problem(cut) is None
    assert problem(dict(cut, facts=dict(cut["facts"], steps_left_out=-1))) == \
        "its steps_left_out is not a count"
    document = analyze(str(tmp_path)).to_json()  # the count reaches analyze's document
    [window] = document["windows"]
    assert window["ranks"][0]["facts"]["steps_left_out"] == 20
    jsonschema.validate(document, SCHEMA)


def test_the_worker_prints_no_more_than_a_manifest_line_holds(tmp_path: Path) -> None:
    """3,000 ProfilerSteps: the summary lists MAX_SUMMARY_STEPS and the line fits."""
    path = tmp_path / "t.pt.trace.json.gz"
    stream_trace(str(path), mb=0, ops=2, steps=3000)
    done = worker(str(path))
    assert done.returncode == 0, done.stderr
    assert len(done.stdout) <= summaries.MAX_KEPT_BYTES
    found = json.loads(done.stdout)["summary"]
    assert len(found["steps"]) == summary_module.MAX_SUMMARY_STEPS
    assert found["facts"]["steps_left_out"] == 3000 - summary_module.MAX_SUMMARY_STEPS
    assert problem(found) is None


def test_the_worker_holds_itself_to_its_memory_bound(tmp_path: Path) -> None:
    """A trace that needs more than the worker may use: one line saying so, exit 0, no
    crash (orjson, which crashes when an allocation fails, never reaches the limit)."""
    path = tmp_path / "t.pt.trace.json.gz"
    stream_trace(str(path), mb=40)
    done = worker(str(path), "--memory-bytes", str(48 << 20))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"error": "out of memory: summarising it needs more "
                                       "than the 48 MiB a summary worker may use"}
    done = worker(str(path))
    assert done.returncode == 0 and json.loads(done.stdout)["summary"]["facts"]["kernels"]


@pytest.mark.slow
def test_the_worker_summarises_a_large_trace_in_little_memory(tmp_path: Path) -> None:
    """300 MB of JSON, 1.75 million events, 590,000 kernels none of which merge: the
    worker's intervals are machine floats, sorted a chunk at a time, and each view's are
    let go once its figures are made (about 110 MiB resident at its peak, both views
    included; 240 while HTA's breakdown sorted and kept Python floats)."""
    path = tmp_path / "t.pt.trace.json.gz"
    stream_trace(str(path), mb=300)
    measure = ("import resource, subprocess, sys\n"
               "done = subprocess.run(sys.argv[1:], capture_output=True, check=True)\n"
               "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
               "sys.stdout.write(f'{peak} ' + done.stdout.decode())\n")
    done = subprocess.run([sys.executable, "-c", measure, sys.executable, "-m",
                           summaries.WORKER, str(path)], capture_output=True, text=True,
                          env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr
    peak, line = done.stdout.split(" ", 1)
    assert int(peak) < 128 << 10, peak  # KiB
    facts = json.loads(line)["summary"]["facts"]
    assert facts["kernels"] > 500_000 and "steps_left_out" not in facts


PARENT = textwrap.dedent("""\
    import os, resource, sys
    from policy_engine.files.records import trace_line
    from policy_engine.runtime.process import manifest, summaries
    out, summaries.WORKER = sys.argv[1], sys.argv[2]
    path = os.path.join(out, "t.pt.trace.json")
    with open(path, "w") as f:
        f.write('{"traceEvents": []}')
    line = trace_line({"role": "trainer", "rank": 0}, capture="1-1", status="complete",
                      path="t.pt.trace.json", bytes=19)
    manifest.append(out, line)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    summaries.order(out, line, path, keep="traces", budget=None)
    assert summaries.wait(240)
    print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
""")
FLOOD = textwrap.dedent("""\
    import os, sys
    chunk = b"x" * (1 << 20)
    pipe = sys.stdout if os.environ["FLOOD"] == "stdout" else sys.stderr
    for _ in range(int(os.environ["FLOOD_MB"])):
        pipe.buffer.write(chunk)
""")


@pytest.mark.parametrize("pipe", ["stdout", "stderr"])
def test_a_worker_that_prints_without_end_costs_the_training_process_nothing(
        tmp_path: Path, pipe: str) -> None:
    """A worker (here a stand-in that floods one pipe with 256 MiB) is killed once it has
    printed more than a summary line may hold; the process that started it keeps its
    peak memory, and the summary line says why there is no summary."""
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "flood_worker.py").write_text(FLOOD)
    (tmp_path / "parent.py").write_text(PARENT)
    env = dict(ENV, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}", FLOOD=pipe, FLOOD_MB="256")
    done = subprocess.run([sys.executable, str(tmp_path / "parent.py"), str(out),
                           "flood_worker"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    before, after = map(int, done.stdout.split())
    assert after - before < 32 << 10, (before, after)  # KiB: the pipe's 256 MiB never read
    [line] = [r for r in scan_manifests(str(out)).records if r["event"] == "summary"]
    most = summaries.MAX_OUT if pipe == "stdout" else summaries.MAX_ERR
    what = "printed" if pipe == "stdout" else "wrote to stderr"
    assert (line["status"], line["kept"]) == ("failed", True)
    assert line["error"] == f"the summary worker {what} more than {most} bytes: it was killed"


def test_report_reads_traces_for_its_analysis_under_its_limits(tmp_path: Path) -> None:
    """Traces with no summary line: the analysis section reads each under --max-trace-mb
    and all under --max-total-mb, and a rank past them says so."""
    run = tmp_path / "run"
    make_run(str(run), 4, ops=400, steps=9, gz=False)  # about 1.5 MiB of text each
    size = max(p.stat().st_size for p in run.rglob("*.pt.trace.json"))
    assert (1 << 20) < size < (2 << 20)
    page = tmp_path / "one.html"
    assert main(["report", str(run), "-o", str(page), "--ops", "0", "--max-trace-mb", "1"]) == 0
    text = page.read_text()
    assert text.count("over the 1.0 MiB read of one trace (--max-trace-mb)") == 1
    assert "over the 1.0 MiB read of one trace (--max-trace-mb) (ranks 0-3)" in text
    page = tmp_path / "all.html"
    assert main(["report", str(run), "-o", str(page), "--ops", "0", "--max-total-mb", "4"]) == 0
    text = page.read_text()
    assert text.count("read in all (--max-total-mb) (ranks 2-3)") == 1
