"""Size forecasts from an earlier run's manifests: `explain --sizes-from` and
`validate --sizes-from`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from policy_engine.cli.main import main
from policy_engine.runtime.process import manifest

POLICY = """\
version: 1
output_dir: out
roles:
  actor:
    enabled: true
    ranks: all
    steps: "1-10"
    limits: {bytes: 25MB}
  critic:
    enabled: true
    backend: [torch, memory]
    steps: [1, 2]
"""


def earlier_run(folder: Path) -> None:
    """Manifest lines as the runtime writes them: actor traces of 4, 5 and 6 MB, a
    failed one that must not count, and one torch and one memory file for the critic."""
    def trace(role: str, size: int | None, status: str = "complete",
              backend: str = "torch") -> dict[str, Any]:
        return {"event": "trace", "capture": "1-1", "role": role, "rank": 0, "world": 1,
                "steps": [1], "path": None if size is None else f"{role}/x", "bytes": size,
                "status": status, "backend": backend, "cycle": 0, "start": 1.0, "end": 2.0}
    for size in (4_000_000, 5_000_000, 6_000_000):
        manifest.append(str(folder), trace("actor", size))
    manifest.append(str(folder), trace("actor", None, status="failed"))
    manifest.append(str(folder), trace("critic", 1_000_000))
    manifest.append(str(folder), trace("critic", 300_000, backend="memory"))


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    earlier = tmp_path / "earlier"
    earlier_run(earlier)
    return policy, earlier


def test_explain_forecasts_each_process_and_the_total(
        setup: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    policy, earlier = setup
    assert main(["explain", str(policy), "--role", "actor", "--world", "2", "--steps", "1-4",
                 "--sizes-from", str(earlier), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    first = data["ranks"][0]["forecast"]
    assert (first["traces"], first["bytes_per_trace"], first["bytes"]) == (
        4, 5_000_000, 20_000_000)
    assert "median of 3 torch traces of role 'actor'" in first["why"]
    assert data["forecast"] == {"bytes": 40_000_000, "traces": 8, "processes": 2,
                                "unknown": 0}
    assert main(["explain", str(policy), "--role", "critic", "--world", "1",
                 "--sizes-from", str(earlier)]) == 0
    text = capsys.readouterr().out
    assert "forecast: 2 traces x 1.2 MiB = 2.5 MiB per process" in text  # torch + memory
    assert "forecast for steps 0-20: 2 traces, 2.5 MiB over 1 profiled processes" in text


def test_validate_warns_when_the_forecast_passes_the_byte_limit(
        setup: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    policy, earlier = setup
    assert main(["validate", str(policy), "--sizes-from", str(earlier)]) == 0
    out = capsys.readouterr().out
    assert ("warning: forecast 47.7 MiB per process (10 traces x 4.8 MiB: median of 3 torch "
            "traces of role 'actor', under") in out
    assert "exceeds limits.bytes 25MB: captures stop after about 5 traces" in out
    assert ":8:13:" in out  # at roles.actor.limits
    assert main(["validate", str(policy)]) == 0
    assert "forecast" not in capsys.readouterr().out


def test_a_folder_with_nothing_to_go_by_is_a_usage_error(
        setup: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy, _ = setup
    assert main(["explain", str(policy), "--role", "actor", "--world", "1",
                 "--sizes-from", str(tmp_path / "nothing")]) == 2
    assert "no complete trace with a size" in capsys.readouterr().err
