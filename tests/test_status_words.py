"""A status word means one thing: a capture whose transition waited for its own thread
(``thread_waits``) finished whole, and readers do not call it interrupted."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from policy_engine import Topology, profile_session
from policy_engine.analysis.listing import collect
from policy_engine.analysis.manifests import scan_manifests
from policy_engine.cli.main import main
from policy_engine.testing import recording_backend


def test_a_worker_threads_step_at_a_transition_leaves_a_complete_capture(
        tmp_path: Path, capsys: Any) -> None:
    policy = {"version": 1, "output_dir": str(tmp_path),
              "roles": {"actor": {"enabled": True, "steps": [1],
                                  "schedule": {"wait": 1, "active": 2, "repeat": 1}}}}
    with recording_backend("torch"):
        prof = profile_session(policy, "actor", Topology())
        with prof.training_step(1):
            worker = threading.Thread(target=prof.step)  # reaches the wait -> active change
            worker.start()
            worker.join()
            for _ in range(3):
                prof.step()
        prof.close()
    [close] = [r for r in scan_manifests(str(tmp_path)).records if r["event"] == "close"]
    assert (close["status"], close["traces"], close["thread_waits"]) == ("complete", 1, 1)
    data = collect(str(tmp_path))  # what `traces` and `report` read
    assert data["interrupted"] == []
    assert [t["status"] for t in data["traces"]] == ["complete"]
    assert main(["traces", str(tmp_path), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["interrupted"] == []
