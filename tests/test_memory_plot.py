"""The offline memory plot: snapshot reading (hostile files included), the replay's numbers,
the page it draws, and ``policy-engine memory-plot``."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from policy_engine.backends.memory.chart import human_time, thin
from policy_engine.backends.memory.plot import (
    Allocation,
    Frame,
    Oom,
    SnapshotError,
    load_snapshot,
    render_html,
    summarize,
    write_plot,
)
from policy_engine.cli.main import main
from policy_engine.language.values.sizes import human_bytes

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
USER = {"filename": "/home/me/train.py", "line": 42, "name": "train_step"}
TORCH = {"filename": "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py",
         "line": 125, "name": "forward"}
CPP = {"filename": "/pytorch/c10/cuda/CUDACachingAllocator.cpp", "line": 1200,
       "name": "c10::cuda::CUDACachingAllocator::malloc"}
STACK = [CPP, TORCH, USER]  # innermost first, as torch records them


def entry(action: str, addr: int, size: int, t: int | None, frames: Any = STACK,
          **extra: Any) -> dict[str, Any]:
    e = {"action": action, "addr": addr, "size": size, "stream": 0, "frames": list(frames),
         **extra}
    if t is not None:
        e["time_us"] = t
    return e


def alloc_free(addr: int, size: int, t: int) -> list[dict[str, Any]]:
    return [entry("free_requested", addr, size, t), entry("free_completed", addr, size, t + 5)]


def block(address: int, size: int, state: str = "active_allocated",
          frames: Any = STACK) -> dict[str, Any]:
    return {"address": address, "size": size, "requested_size": size, "state": state,
            "frames": list(frames)}


def segment(address: int, total: int, blocks: list[dict[str, Any]],
            device: int = 0) -> dict[str, Any]:
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    return {"device": device, "address": address, "total_size": total, "stream": 0,
            "segment_type": "large", "segment_pool_id": (0, 0), "allocated_size": allocated,
            "active_size": allocated, "requested_size": allocated, "blocks": blocks}


def snapshot(traces: list[list[dict[str, Any]]], segments: list[dict[str, Any]]
             ) -> dict[str, Any]:
    return {"segments": segments, "device_traces": traces,
            "allocator_settings": {"expandable_segments": False}, "external_annotations": []}


A, B, C, D = 0x7F0000000000, 0x7F0000400000, 0x7F0000C00000, 0x7F0000E00000


def simple() -> dict[str, Any]:
    """One 20 MiB segment; A 4, B 8, C 2 MiB; B freed, D 1 MiB, an OOM, A freed."""
    trace = [
        entry("segment_alloc", A, 20 * MiB, 1000),
        entry("alloc", A, 4 * MiB, 1100),
        entry("alloc", B, 8 * MiB, 1200),
        entry("alloc", C, 2 * MiB, 1300, frames=[{**USER, "name": "<lambda>"}]),
        *alloc_free(B, 8 * MiB, 1400),
        entry("alloc", D, 1 * MiB, 1500),
        {"action": "oom", "size": 64 * MiB, "device_free": 1 * MiB, "stream": 0,
         "time_us": 1600, "frames": []},
        *alloc_free(A, 4 * MiB, 1700),
    ]
    seg = segment(A, 20 * MiB, [block(A, 12 * MiB, "inactive"), block(C, 2 * MiB),
                                block(D, 1 * MiB), block(D + MiB, 5 * MiB, "inactive")])
    return snapshot([trace], [seg])


def write(path: Path, data: object) -> Path:
    path.write_bytes(pickle.dumps(data))
    return path


def test_the_fixtures_have_the_shape_torch_reads() -> None:
    """torch's own text views read the snapshots these tests build."""
    viz = pytest.importorskip("torch.cuda._memory_viz")
    assert "raise OutOfMemoryError" in viz.trace(simple())
    assert "20.0MiB" in viz.segsum(simple())


def test_the_replay_finds_the_peak_and_what_was_live_then() -> None:
    s = summarize(simple())
    assert (s.device, s.devices, s.events, s.time_unit) == (0, (0,), 10, "us")
    assert (s.peak_allocated, s.peak_time, s.peak_reserved) == (14 * MiB, 1300, 20 * MiB)
    assert list(s.times) == [1000, 1000, 1100, 1200, 1300, 1405, 1500, 1705]
    assert [v // MiB for v in s.allocated] == [0, 0, 4, 12, 14, 6, 7, 3]
    assert [v // MiB for v in s.reserved] == [0, 20, 20, 20, 20, 20, 20, 20]
    assert [(a.address, a.size, a.time) for a in s.largest] == [
        (B, 8 * MiB, 1200), (A, 4 * MiB, 1100), (C, 2 * MiB, 1300)]
    assert s.largest[0].frames == tuple(Frame(**f) for f in STACK)
    assert s.ooms == (Oom(1600, 64 * MiB, 1 * MiB),)
    assert s.notes == ()
    assert [a.size for a in summarize(simple(), top=1).largest] == [8 * MiB]


def test_a_trace_that_begins_mid_run_starts_from_what_was_live() -> None:
    """X (6 MiB) was allocated before the trace and is freed in it; Z (5 MiB) is live at the
    dump and never touched; W (1 MiB) awaits its free_completed. 8 of the 32 reserved MiB
    were added during the trace."""
    X, Y, Z, W = 0x1000000, 0x2000000, 0x3000000, 0x4000000
    frames_z = [{**USER, "line": 7, "name": "build_model"}]
    trace = [entry("free_requested", X, 6 * MiB, 10), entry("free_completed", X, 6 * MiB, 11),
             entry("segment_alloc", Y, 8 * MiB, 15), entry("alloc", Y, 10 * MiB, 20),
             entry("free_requested", W, 1 * MiB, 30)]
    segs = [segment(Z, 24 * MiB, [block(Z, 5 * MiB, frames=frames_z),
                                  block(W, 1 * MiB, "active_awaiting_free")]),
            segment(Y, 8 * MiB, [block(Y, 10 * MiB)])]
    s = summarize(snapshot([trace], segs))
    assert (s.allocated[0], s.reserved[0]) == (12 * MiB, 24 * MiB)
    assert [v // MiB for v in s.allocated] == [12, 6, 6, 16, 16]
    assert min(s.allocated) >= 0
    assert (s.peak_allocated, s.peak_time) == (16 * MiB, 20)
    assert s.largest == (Allocation(Y, 10 * MiB, 20, tuple(Frame(**f) for f in STACK)),
                         Allocation(Z, 5 * MiB, None, (Frame(**frames_z[0]),)),
                         Allocation(W, 1 * MiB, None, tuple(Frame(**f) for f in STACK)))
    assert any("mid-run" in note for note in s.notes)
    page = render_html(s, "mid")
    assert "before the trace" in page and "build_model" in page


def test_a_peak_before_the_first_entry_lists_what_was_live_then() -> None:
    trace = [entry("free_completed", A, 4 * MiB, 10)]
    s = summarize(snapshot([trace], [segment(A, 4 * MiB, [])]))
    assert (s.peak_allocated, s.peak_time) == (4 * MiB, 10)
    assert s.largest == (Allocation(A, 4 * MiB, None, ()),)
    assert "no stack recorded" in render_html(s, "t")


def test_several_devices_pick_the_busiest_or_the_one_asked() -> None:
    one = [entry("alloc", A, 1 * MiB, 1), *alloc_free(A, 1 * MiB, 2)]
    data = snapshot([[entry("alloc", B, 3 * MiB, 1)], one],
                    [segment(B, 3 * MiB, [block(B, 3 * MiB)]),
                     segment(A, 2 * MiB, [], device=1)])
    assert (summarize(data).device, summarize(data).devices) == (1, (0, 1))
    assert summarize(data).peak_allocated == 1 * MiB
    assert summarize(data, 0).peak_allocated == 3 * MiB
    assert summarize(data, 0).reserved[0] == 3 * MiB
    with pytest.raises(SnapshotError, match=r"no device 3 .*devices with data: 0, 1"):
        summarize(data, 3)


def test_without_history_the_plot_is_the_state_at_the_dump() -> None:
    data = snapshot([[], []], [segment(A, 8 * MiB, [block(A, 2 * MiB), block(B, 3 * MiB),
                                                    block(C, 3 * MiB, "inactive")], device=1)])
    s = summarize(data)
    assert (s.device, s.events, list(s.times), s.peak_allocated) == (1, 0, [0], 5 * MiB)
    assert list(s.reserved) == [8 * MiB]
    assert [a.address for a in s.largest] == [B, A]
    page = render_html(s, "idle")
    ET.fromstring(page.removeprefix("<!DOCTYPE html>\n"))
    assert "state at the dump" in page and "no allocator history" in page
    empty = summarize(snapshot([], []))
    assert (empty.device, empty.peak_allocated, empty.largest) == (0, 0, ())
    assert "<svg" in render_html(empty, "nothing")


def test_entries_without_times_are_plotted_by_position() -> None:
    trace = [entry("alloc", A, 2 * MiB, None), entry("alloc", B, 1 * MiB, None),
             entry("free_completed", A, 2 * MiB, None)]
    s = summarize(snapshot([trace], []))
    assert (s.time_unit, s.peak_time, list(s.times)) == ("event", 1, [0, 0, 1, 2])
    assert "trace entry" in render_html(s, "t")


def test_a_trace_recorded_without_free_completed_frees_at_free_requested() -> None:
    trace = [entry("alloc", A, 2 * MiB, 1), entry("free_requested", A, 2 * MiB, 2)]
    assert list(summarize(snapshot([trace], [])).allocated) == [0, 2 * MiB, 0]


def test_unreadable_parts_are_left_out_not_fatal() -> None:
    trace: list[Any] = [1, "x", None, {"action": 5}, {"action": "alloc"},
                        {"action": "alloc", "addr": "0x10", "size": 4},
                        entry("alloc", A, 1 * MiB, 3, frames="nope"),
                        {**entry("alloc", B, 1 * MiB, 4), "frames": [7, {"line": "x"}]}]
    segs: list[Any] = [None, {"device": "x"}, {"device": 0, "blocks": [None, {"state": 1}]}]
    s = summarize({"segments": segs, "device_traces": [trace]})
    assert s.peak_allocated == 2 * MiB
    assert s.largest[1].frames == (Frame("?", 0, "?"),)
    assert any("left out 4" in note for note in s.notes)
    ET.fromstring(render_html(s, "odd").removeprefix("<!DOCTYPE html>\n"))


def page_of(data: dict[str, Any], title: str = "t") -> str:
    return render_html(summarize(data), title)


def test_the_page_is_one_well_formed_self_contained_file() -> None:
    page = page_of(simple(), "run <3> & co")
    root = ET.fromstring(page.removeprefix("<!DOCTYPE html>\n"))
    svg = root.find(".//svg")
    assert svg is not None
    paths = svg.findall(".//path")
    assert len(paths) == 2 and all(p.get("d", "").startswith("M") for p in paths)
    assert svg.find(".//circle") is not None  # the peak
    assert "peak 14 MiB" in page and "OOM" in page and "out of memory asking for 64 MiB" in page
    assert "<script" not in page.lower() and "url(" not in page and "@import" not in page
    assert not re.search(r"(src|href)\s*=", page, re.I)
    assert "http://" not in page and "https://" not in page
    assert "run &lt;3&gt; &amp; co" in page and "<3>" not in page
    assert "&lt;lambda&gt;" in page and "<lambda>" not in page
    # Axis labels in human units; the table lists B, A, C with their user frames.
    assert "MiB</text>" in page and "first trace entry (us)" in page
    table = page[page.index("<table>"):]
    assert table.index("0x7f0000400000") < table.index("0x7f0000000000") \
        < table.index("0x7f0000c00000")
    assert "train_step  /home/me/train.py:42" in table
    assert "CUDACachingAllocator" not in table and "linear.py" not in table


def test_stacks_of_torch_frames_only_are_shown_not_dropped() -> None:
    data = simple()
    data["device_traces"][0][2]["frames"] = [CPP, TORCH]
    table = page_of(data).split("<table>")[1]
    assert "linear.py:125" in table and "CUDACachingAllocator.cpp" in table


def test_a_long_trace_draws_a_small_page_and_keeps_its_peak() -> None:
    trace = []
    for i in range(50_000):  # 200k entries: alloc, free_requested, free_completed, alloc
        addr = 0x10000000 + (i % 64) * 0x100000
        trace.append(entry("alloc", addr, MiB + (i % 7) * 4096, 4 * i, frames=[USER]))
        trace.extend(alloc_free(addr, MiB + (i % 7) * 4096, 4 * i + 1))
        trace.append(entry("segment_alloc" if i % 2 else "segment_free", addr, 2 * MiB,
                           4 * i + 3, frames=[]))
    # A short spike just after entry 123_456 (the alloc of round 30864): the peak.
    trace[123_457:123_457] = [entry("alloc", 0x1, 512 * MiB, 123_457),
                              entry("free_completed", 0x1, 512 * MiB, 123_457)]
    s = summarize(snapshot([trace], []))
    assert s.events == 200_002 and s.peak_time == 123_457
    assert s.peak_allocated == 512 * MiB + MiB + (30864 % 7) * 4096
    page = render_html(s, "long")
    assert len(page.encode()) < 300_000
    assert f"peak {human_bytes(s.peak_allocated)}" in page
    d = ET.fromstring(page.removeprefix("<!DOCTYPE html>\n")).findall(".//path")[1].get("d")
    assert d is not None and d.count("H") <= 4 * 860
    ys = [float(v) for v in re.findall(r"V([\d.]+)", d)]
    assert min(ys) < 40  # the spike is drawn, near the top of the plot


def test_thin_keeps_the_extremes_of_every_column() -> None:
    xs = list(range(10_000))
    ys = [(i * 7919) % 1000 for i in xs]
    kept = thin(xs, ys, 100)
    assert len(kept) <= 400 and kept == sorted(kept) and kept[0] == 0 and kept[-1] == 9999
    for col in range(100):
        part = range(col * 100, col * 100 + 100)
        assert max(ys[i] for i in part) in {ys[i] for i in kept if i in part}
        assert min(ys[i] for i in part) in {ys[i] for i in kept if i in part}


@pytest.mark.parametrize(("n", "text"), [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"),
                                         (3 * MiB, "3 MiB"), (5 << 40, "5 TiB")])
def test_human_bytes(n: int, text: str) -> None:
    assert human_bytes(n) == text


def test_human_time() -> None:
    assert [human_time(t) for t in (12, 2500, 3_400_000)] == ["12 us", "2.5 ms", "3.4 s"]


class Boom:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def hostile_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    marker = tmp_path / "pwned"
    good = pickle.dumps(simple())
    files = {
        "reduce": (write(tmp_path / "reduce.pickle", Boom(marker)), "posix.system"),
        "nested": (write(tmp_path / "nested.pickle", {"segments": [Boom(marker)],
                                                       "device_traces": []}), "system"),
        "truncated": (tmp_path / "trunc.pickle", "truncated"),
        "list": (write(tmp_path / "list.pickle", [simple()]), "holds a list"),
        "text": (tmp_path / "notes.txt", "not a memory snapshot pickle"),
        "empty": (tmp_path / "empty.pickle", "empty file"),
        "no traces": (write(tmp_path / "old.pickle", {"segments": []}), "'device_traces'"),
        "bad traces": (write(tmp_path / "bad.pickle", {"segments": [], "device_traces": [1]}),
                       "lists of entries"),
        "missing": (tmp_path / "absent.pickle", "cannot read"),
        "folder": (tmp_path, "not a regular file"),
    }
    files["truncated"][0].write_bytes(good[: len(good) // 2])
    files["text"][0].write_text("hello: this is yaml, not a pickle\n")
    files["empty"][0].write_bytes(b"")
    return files


def test_hostile_and_broken_files_are_refused_with_the_reason(tmp_path: Path) -> None:
    for name, (path, reason) in hostile_files(tmp_path).items():
        with pytest.raises(SnapshotError) as caught:
            load_snapshot(str(path))
        assert caught.value.path == str(path), name
        assert str(caught.value).startswith(f"{path}: ") and reason in str(caught.value), name
    assert not (tmp_path / "pwned").exists()


def test_large_files_are_refused_before_reading(tmp_path: Path) -> None:
    path = write(tmp_path / "big.pickle", simple())
    with pytest.raises(SnapshotError, match="is more than the 1 KiB this reads"):
        load_snapshot(str(path), max_bytes=1024)
    assert load_snapshot(str(path))["device_traces"] == simple()["device_traces"]


def test_write_plot_writes_the_page_whole(tmp_path: Path) -> None:
    snap = write(tmp_path / "s.pickle", simple())
    out = tmp_path / "page.html"
    assert write_plot(str(snap), str(out), top=2, title="T") == str(out)
    assert "<h1>T</h1>" in out.read_text() and out.read_text().count("<tr>") == 3
    with pytest.raises(SnapshotError, match="replace the snapshot"):
        write_plot(str(snap), str(snap))
    with pytest.raises(SnapshotError, match=f"{snap}: no device 2"):
        write_plot(str(snap), str(out), device=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.html", "s.pickle"]


def test_the_command_writes_next_to_the_snapshot(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    snap = write(tmp_path / "rank0.pickle", simple())
    assert main(["memory-plot", str(snap)]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'rank0.html'}\n"
    assert main(["memory-plot", str(snap), "-o", str(tmp_path / "x.html"), "--top", "1",
                 "--device", "0"]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'x.html'}\n"
    assert (tmp_path / "x.html").read_text().count("<tr>") == 2
    other = write(tmp_path / "dump.pkl", simple())
    assert main(["memory-plot", str(other)]) == 0
    assert capsys.readouterr().out == f"{other}.html\n"


def test_the_command_says_what_is_wrong_in_one_line(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    for path, reason in hostile_files(tmp_path).values():
        assert main(["memory-plot", str(path), "-o", str(tmp_path / "o.html")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"policy-engine memory-plot: {path}: ") and reason in err
        assert err.count("\n") == 1 and "Traceback" not in err
    snap = write(tmp_path / "s.pickle", simple())
    assert main(["memory-plot", str(snap), "--device", "9"]) == 2
    assert capsys.readouterr().err.startswith(f"policy-engine memory-plot: {snap}: no device 9")
    assert main(["memory-plot", str(snap), "-o", str(tmp_path / "none" / "o.html")]) == 2
    assert "cannot write" in capsys.readouterr().err
    assert not (tmp_path / "pwned").exists()


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "policy_engine", "memory-plot", *argv],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_the_command_runs_as_a_module_without_torch(tmp_path: Path) -> None:
    snap = write(tmp_path / "s.pickle", simple())
    done = run_cli(str(snap))
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{tmp_path / 's.html'}\n", "")
    assert "<svg" in (tmp_path / "s.html").read_text()
    bad = write(tmp_path / "evil.pickle", Boom(tmp_path / "pwned"))
    done = run_cli(str(bad))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"policy-engine memory-plot: {bad}: not a memory snapshot")
    assert done.stderr.count("\n") == 1 and not (tmp_path / "pwned").exists()
    probe = ("import sys; from policy_engine.cli.main import main; "
             f"main(['memory-plot', {str(snap)!r}]); "
             "print(any(m == 'torch' or m.startswith('torch.') for m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.splitlines()[-1] == "False", done.stderr
