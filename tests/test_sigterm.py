"""SIGTERM at any moment loses nothing already recorded: a property test.

A fork server (signal_scripts/zygote.py) imports the engine once and forks one child per
run; each child profiles a short loop (two captures of two cycles each, warm-up between)
and gets SIGTERM after a delay this test draws from a seeded generator: one delay in each
of RUNS equal slices of the child's run, so that few runs reach every part of it. Whatever the
moment (opening, a start, a step, a stop, a save, a background export, a close), every
capture that wrote an ``open`` line must have its ``close`` line, every trace line it
counts, every file whole, no temporary file left, and a capture cut short must say why.
How long each call takes is the machine's: where the random delays reach no stop, save or
export, or no start or step, up to 20 more runs are aimed at the middle of such calls in
the timeline the runs logged, until one lands there.

``POLICY_ENGINE_SIGTERM_SEED`` replays a run; ``POLICY_ENGINE_SIGTERM_RUNS`` sets the
number of runs per export mode.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from policy_engine.analysis.manifests import scan_manifests
from policy_engine.files.layout import find_leftovers

pytestmark = pytest.mark.slow

ZYGOTE = Path(__file__).parent / "signal_scripts" / "zygote.py"
SEED = int(os.environ.get("POLICY_ENGINE_SIGTERM_SEED") or random.randrange(1 << 32))
RUNS = int(os.environ.get("POLICY_ENGINE_SIGTERM_RUNS", "50"))
TRAILER = b"END\n"


class Zygote:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(ZYGOTE), *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)

    def run(self, run: Path, mode: str, delay: float) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"run": str(run), "mode": mode,
                                          "delay": delay}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the fork server died (seed {SEED})"
        result: dict[str, Any] = json.loads(line)
        return result

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture
def zygote() -> Iterator[Zygote]:
    server = Zygote()
    yield server
    server.close()


def whole(path: Path, size: int | None) -> str | None:
    """Why the trace at ``path`` is not whole, or None."""
    if not path.is_file():
        return "missing"
    data = path.read_bytes()
    if size is not None and len(data) != size:
        return f"{len(data)} bytes, the line says {size}"
    if path.name.endswith(".gz"):
        try:
            events = json.loads(gzip.decompress(data))
        except (OSError, EOFError, ValueError) as err:
            return f"not a whole gzip JSON: {err!r}"
        return None if "traceEvents" in events else "no traceEvents"
    return None if data.endswith(TRAILER) else "no trailer: cut short"


def problems(run: Path, status: int) -> list[str]:
    """Everything wrong with what a run left (empty when it kept every promise)."""
    out = run / "out"
    found: list[str] = []
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM) and \
            not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
        found.append(f"the child ended with wait status {status}")
    if not out.exists():
        return found  # SIGTERM before the first capture opened: nothing to keep
    scan = scan_manifests(str(out))
    found += [f"bad manifest line {p.line}: {p.why}" for p in scan.problems]
    found += [f"leftover temporary file {name}" for name in find_leftovers(str(out))]
    captures: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for record in scan.records:
        if "capture" in record:
            captures.setdefault(record["capture"], {}).setdefault(
                record["event"], []).append(record)
    signalled = os.WIFSIGNALED(status)
    for cid, lines in captures.items():
        opens, closes, traces = lines.get("open", []), lines.get("close", []), \
            lines.get("trace", [])
        if len(opens) != 1 or len(closes) != 1:
            found.append(f"{cid}: {len(opens)} open and {len(closes)} close lines")
            continue
        close = closes[0]
        if close["traces"] != len(traces):
            found.append(f"{cid}: close counts {close['traces']} traces, "
                         f"{len(traces)} trace lines")
        for line in traces:
            if line.get("path"):
                why = whole(out / line["path"], line.get("bytes"))
                if why is not None or line["status"] not in ("complete", "partial"):
                    found.append(f"{cid}: {line['path']} ({line['status']}): {why}")
            elif not line.get("error"):
                found.append(f"{cid}: a trace line without a file says nothing: {line}")
        if close["status"] in ("failed", "interrupted") and not close.get("error"):
            found.append(f"{cid}: close {close['status']} without an error")
        elif close["status"] == "partial" and not (
                signalled and close.get("stopped_by") == "SIGTERM arrived"):
            found.append(f"{cid}: close partial, stopped_by {close.get('stopped_by')!r}")
        elif close["status"] not in ("complete", "partial"):
            found.append(f"{cid}: close {close['status']}: {close.get('error')}")
    return found


def moment(run: Path, signalled: float) -> str:
    """The backend call under way when SIGTERM was sent (from the child's log)."""
    phases = run / "phases"
    if not phases.exists():
        return "before the first capture"
    open_calls: dict[str, float] = {}
    for row in phases.read_text().splitlines():
        name, edge, at = row.split()
        if float(at) > signalled:
            break
        if edge == "b":
            open_calls[name] = float(at)
        else:
            open_calls.pop(name, None)
    if not open_calls:
        return "between calls"
    return max(open_calls, key=lambda k: open_calls[k])


def spread(rng: random.Random, longest: float, runs: int) -> list[float]:
    """``runs`` delays in [0, longest): one at a random point of each of ``runs`` equal
    slices (a uniform draw that leaves no part of the run out), in a random order."""
    delays = [(i + rng.random()) * longest / runs for i in range(runs)]
    rng.shuffle(delays)
    return delays


def timeline(run: Path, signalled: float, delay: float) -> dict[str, list[float]]:
    """The middle of each backend call the run logged, as a delay after the child said it
    was ready (the moment the delays count from)."""
    ready = signalled - delay
    begun: dict[str, float] = {}
    calls: dict[str, list[float]] = {}
    phases = run / "phases"
    for row in phases.read_text().splitlines() if phases.exists() else []:
        name, edge, at = row.split()
        if edge == "b":
            begun[name] = float(at)
        elif name in begun:
            calls.setdefault(name, []).append((begun.pop(name) + float(at)) / 2 - ready)
    return calls


def sweep(zygote: Zygote, root: Path, mode: str,
          delays: list[float]) -> tuple[Counter[str], dict[str, list[float]]]:
    """Where SIGTERM landed in each run, and the timeline of the run signalled last."""
    where: Counter[str] = Counter()
    latest: tuple[float, dict[str, list[float]]] = (-1.0, {})
    for i, delay in enumerate(delays):
        run = root / f"{mode}-{i}"
        result = zygote.run(run, mode, delay)
        found = problems(run, result["status"])
        stderr = (run / "stderr").read_text() if (run / "stderr").exists() else ""
        assert not found, (f"seed {SEED}, {mode} run {i}, SIGTERM after {delay:.4f} s "
                           f"during {moment(run, result['signalled'])}: {found}\n{stderr}")
        where[moment(run, result["signalled"])] += 1
        if delay > latest[0]:
            latest = (delay, timeline(run, result["signalled"], delay))
    return where, latest[1]


#: The kinds of moment the runs must reach, each one of these calls under way.
MOMENTS = (("stop", "save", "export"), ("step", "start"))
AIMED = 20  # at most this many runs more, aimed at a kind of moment the random ones missed


@pytest.mark.parametrize("mode", ["sync", "background"])
def test_sigterm_at_random_moments_loses_nothing(zygote: Zygote, tmp_path: Path,
                                                 mode: str) -> None:
    rng = random.Random(f"{SEED}-{mode}")
    delays = spread(rng, 0.25, RUNS)
    where, calls = sweep(zygote, tmp_path, mode, delays)
    print(f"seed {SEED}, {mode}: SIGTERM landed in {dict(where)}")
    # The delays reach every kind of moment (the log says which call was under way). How
    # long each call takes is the machine's: a kind the random delays missed gets runs
    # aimed at the middle of its calls in the timeline of a run, until one lands there.
    for i in range(AIMED):
        missed = [kind for kind in MOMENTS if not sum(where[name] for name in kind)]
        targets = [t for kind in missed for name in kind for t in calls.get(name, [])]
        if not targets:
            break
        aimed, more = sweep(zygote, tmp_path / f"aimed{i}", mode, [rng.choice(targets)])
        where += aimed
        for name, times in more.items():
            calls.setdefault(name, []).extend(times)
    print(f"seed {SEED}, {mode}: with the aimed runs, SIGTERM landed in {dict(where)}")
    assert all(sum(where[name] for name in kind) for kind in MOMENTS), (SEED, dict(where))


@pytest.mark.parametrize("mode", ["sync", "background"])
def test_sigterm_on_real_torch_loses_nothing(tmp_path: Path, mode: str) -> None:
    pytest.importorskip("torch")
    rng = random.Random(f"{SEED}-torch-{mode}")
    server = Zygote("--torch")
    try:  # a child's first profiler start takes a second or two (kineto starts up)
        sweep(server, tmp_path, mode, spread(rng, 3.5, 6))
    finally:
        server.close()
