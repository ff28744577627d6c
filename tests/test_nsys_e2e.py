"""Nsight Systems for real: a training loop under `nsys profile`, launched with the
wrapper `policy-engine nsys-args` writes, read back from nsys's SQLite export.

Needs Debian's nsight-systems (2022.4, non-free), which scripts/install_nsys.sh unpacks
into the user cache without touching the system's apt, and nvtx 0.2.11, pip-installed
for this interpreter into the same cache. Without either the test is skipped with the
reason; with both it runs on a CPU-only machine (NVTX capture ranges need no GPU).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from policy_engine.analysis.manifests import read_manifests
from policy_engine.backends.nsight.launch import resolve_output

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "nsys_scripts" / "nsys_train.py"
NVTX_VERSION = "0.2.11"
TIMEOUT = 180  # a hung nsys must fail the test, not CI

# Steps 1, 3 and 4 profiled, 3-4 as one capture; two inner steps per outer step; the
# schedule records the second of every two inner steps, twice per capture at most. So:
# capture (1) records step 1 iter 1; capture (3-4) records step 3 iter 1 and step 4
# iter 1. Three capture ranges per process, one report each.
POLICY = """\
version: 1
prefix: e2e
output_dir: profiles
roles:
  trainer:
    enabled: true
    backend: nsys
    ranks: [0]
    steps: [1, 3, 4]
    merge_steps: true
    schedule: {wait: 1, active: 1, repeat: 2}
    regions: [update_actor, compute_log_prob]
    name: "<prefix>_<role>[_step<step>][_c<cycle>]_rank<rank>-of-<world>_pid<pid>"
    nsight:
      capture: nvtx
      domain: e2e_regions
      options: {trace: nvtx, sample: none, cpuctxsw: none, export: sqlite}
"""
STEPS, ITERATIONS = 6, 2
EXPECTED = [  # per report: the marks it holds, and (capture_range, steps, cycle) recorded
    (["step 1 iter 1"], (0, [1], 0)),
    (["step 3 iter 1"], (1, [3], 0)),
    (["step 4 iter 1"], (2, [4], 1)),  # a cycle's line lists its own steps
]


def _cache() -> Path:
    default = Path.home() / ".cache" / "policy-engine"
    return Path(os.environ.get("POLICY_ENGINE_CACHE", default))


@pytest.fixture(scope="module")
def nsys() -> str:
    """The nsys binary, unpacked by scripts/install_nsys.sh (skip when it cannot be had)."""
    try:
        proc = subprocess.run(
            ["bash", str(REPO / "scripts" / "install_nsys.sh")],
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        pytest.skip(f"Nsight Systems could not be installed: {err}")
    if proc.returncode == 2:
        pytest.skip(f"Nsight Systems is not available here: {proc.stderr.strip()}")
    assert proc.returncode == 0, f"install_nsys.sh failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def nvtx_path() -> str:
    """A folder that makes nvtx 0.2.11 importable for this interpreter ("" if it is)."""
    try:
        if metadata.version("nvtx") == NVTX_VERSION:
            return ""
    except metadata.PackageNotFoundError:
        pass
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}"
    target = _cache() / f"nvtx-{NVTX_VERSION}-{tag}"
    if not (target / "nvtx").is_dir():
        staging = target.with_name(f"{target.name}.{os.getpid()}")
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--target",
                str(staging),
                f"nvtx=={NVTX_VERSION}",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot pip install nvtx=={NVTX_VERSION}: {proc.stderr.strip()[-500:]}")
        staging.replace(target)
    return str(target)


def _run(argv: list[str], env: dict[str, str], log: Path) -> None:
    """Run to completion in its own process group; on timeout kill the group and fail."""
    with open(log, "w") as out:
        proc = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"{argv[:3]} hung for {TIMEOUT}s:\n{log.read_text()[-4000:]}")
    assert code == 0, f"{argv[:3]} exited {code}:\n{log.read_text()[-4000:]}"


@pytest.fixture(scope="module")
def run(nsys: str, nvtx_path: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """nsys-args writes the wrapper; ranks 0 (profiled) and 1 (not) run through it."""
    tmp = tmp_path_factory.mktemp("nsys")
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    env = {
        **os.environ,
        "NSYS": nsys,
        "WORLD_SIZE": "2",
        "PYTHONPATH": os.pathsep.join(
            p for p in (nvtx_path, str(REPO), os.environ.get("PYTHONPATH")) if p
        ),
    }
    cli = [
        sys.executable,
        "-m",
        "policy_engine",
        "nsys-args",
        str(policy),
        "--role",
        "trainer",
        "--world",
        "2",
        "--inner-steps",
        str(ITERATIONS),
    ]
    launch = json.loads(
        subprocess.run(
            [*cli, "--format", "json"], env=env, check=True, capture_output=True, text=True
        ).stdout
    )
    wrapper = tmp / "nsys-wrap.sh"
    wrapper.write_text(
        subprocess.run(cli, env=env, check=True, capture_output=True, text=True).stdout
    )
    reports = {}
    for rank in (0, 1):
        report = tmp / f"rank{rank}.json"
        _run(
            [
                "sh",
                str(wrapper),
                sys.executable,
                str(SCRIPT),
                str(policy),
                "trainer",
                str(STEPS),
                str(ITERATIONS),
                str(report),
            ],
            {**env, "RANK": str(rank)},
            tmp / f"rank{rank}.log",
        )
        # The wrapper waits for the program after nsys returns (it needs `ps`); make sure.
        deadline = time.monotonic() + TIMEOUT
        while not report.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        reports[rank] = json.loads(report.read_text())
    me = reports[0]
    output = resolve_output(
        launch["ranks"]["0"]["output"],
        pid=me["pid"],
        host=socket.gethostname(),
        environ={"RANK": "0"},
    )
    return {"launch": launch, "reports": reports, "output": output, "profiles": tmp / "profiles"}


def nvtx_events(path: str) -> list[tuple[int, int | None, str, str]]:
    """(start, end, domain, text) of every NVTX range and mark in an nsys SQLite export."""
    db = sqlite3.connect(path)
    try:
        domains = {
            d: text
            for d, text in db.execute("SELECT domainId, text FROM NVTX_EVENTS WHERE eventType = 75")
        }  # DomainCreate
        rows = db.execute(
            "SELECT e.start, e.end, e.domainId, COALESCE(e.text, s.value) FROM NVTX_EVENTS e "
            "LEFT JOIN StringIds s ON e.textId = s.id "
            "WHERE e.eventType IN (34, 59, 60) ORDER BY e.start"
        )  # mark, push/pop, start/end
        return [(start, end, domains.get(domain, ""), text) for start, end, domain, text in rows]
    finally:
        db.close()


def test_launch_arguments_from_the_plan(run: dict[str, Any]) -> None:
    launch = run["launch"]
    assert launch["ranges_per_process"] == 3
    assert launch["capture_range_end"] == "repeat-shutdown:3"
    assert (launch["profiled_ranks"], launch["unprofiled_ranks"]) == ("0", "1")


def test_exactly_the_planned_captures(run: dict[str, Any]) -> None:
    """One report per planned capture range, each holding exactly its planned steps with
    the region ranges inside the capture range."""
    output = run["output"]
    folder = Path(output).parent
    assert sorted(p.name for p in folder.glob("*.nsys-rep")) == [
        f"{Path(output).name}.{n}.nsys-rep" for n in (1, 2, 3)
    ]
    for n, (marks, _) in enumerate(EXPECTED, start=1):
        events = nvtx_events(f"{output}.{n}.sqlite")
        [(start, end, _, _)] = [
            e for e in events if e[2:] == ("policy_engine", "policy_engine.capture")
        ]
        assert end is not None
        assert [e[3] for e in events if e[2] == "e2e"] == marks
        regions = [e for e in events if e[2] == "e2e_regions"]
        assert sorted(e[3] for e in regions) == sorted(
            ["update_actor", "compute_log_prob", f"ProfilerStep#{1 + 2 * (n == 3)}"]
        )
        assert all(start <= s and e is not None and e <= end for s, e, _, _ in regions)
        [meta] = [e[3] for e in events if e[2] == "policy_engine" and e[1] is None]
        assert json.loads(meta.split(" ", 1)[1])["capture_range"] == n - 1


def test_reports_appear_before_exit(run: dict[str, Any]) -> None:
    """repeat-shutdown:N with the exact N: nsys writes the reports as the last range closes,
    while the process still runs (it lingers two seconds after its loop)."""
    loop_end = run["reports"][0]["loop_end"]
    for n in (1, 2, 3):
        assert os.path.getmtime(f"{run['output']}.{n}.nsys-rep") <= loop_end + 1.0


def test_manifest_maps_reports_to_steps(run: dict[str, Any]) -> None:
    records = sorted(read_manifests(str(run["profiles"])), key=lambda r: r["start"])
    assert [(r["extra"]["capture_range"], r["steps"], r["cycle"]) for r in records] == [
        expected for _, expected in EXPECTED
    ]
    assert all(r["backend"] == "nsight" and r["rank"] == 0 for r in records)


def test_manifest_paths_are_the_reports(run: dict[str, Any]) -> None:
    """The manifest names the files nsys wrote (the runtime passes the backend the nsys
    output name: ``backends.nsight.session_settings``)."""
    records = sorted(read_manifests(str(run["profiles"])), key=lambda r: r["start"])
    assert [r["path"] for r in records] == [
        f"{Path(run['output']).name}.{n}.nsys-rep" for n in (1, 2, 3)
    ]


def test_unprofiled_rank_runs_without_nsys(run: dict[str, Any]) -> None:
    assert run["reports"][0] | {"pid": 0, "loop_end": 0} == {
        "pid": 0,
        "loop_end": 0,
        "profiled": True,
        "under_nsys": True,
    }
    assert run["reports"][1] | {"pid": 0, "loop_end": 0} == {
        "pid": 0,
        "loop_end": 0,
        "profiled": False,
        "under_nsys": False,
    }
