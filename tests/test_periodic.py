"""Periodic steps on real torch: a 40-step training loop in a child process writes exactly
the traces explain predicts, named by the steps they recorded.

Two shapes: ``steps: {every: 10, from: 5}`` (each profiled step its own capture, the whole
step recorded), and torchtitan's (``steps: all`` + ``merge_steps`` + a repeating schedule:
one capture, a trace per cycle, ``<step>`` the step each cycle recorded).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from policy_engine import load_policy
from policy_engine.analysis.manifests import read_manifests
from policy_engine.plan.predict import explain

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

STEPS = 40

CHILD = """
import sys, torch
from policy_engine import Topology, apply_policy, load_policy

class Trainer:
    def __init__(self):
        self.model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                         torch.nn.Linear(64, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def train_step(self):
        loss = self.model(torch.randn(16, 32)).pow(2).mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()

trainer = Trainer()
prof = apply_policy(trainer, role="trainer", policy=load_policy(sys.argv[1]),
                    topology=Topology(rank=1, world=2))
for step in range(1, int(sys.argv[2]) + 1):
    with prof.training_step(step):
        trainer.train_step()
        prof.step()          # once per training step, at its end (torchtitan's loop)
prof.close()
"""

EVERY = """\
    steps: {every: 10, from: 5}
    name: "<role>_step<step>_rank<rank>"
"""
TORCHTITAN = """\
    steps: all
    merge_steps: true
    schedule: {wait: 7, warmup: 2, active: 1, repeat: 0}
    name: "iteration_<step>/rank<rank>_trace"
"""


def run_child(tmp_path: Path, role: str) -> tuple[Path, Any]:
    path = tmp_path / "policy.yaml"
    path.write_text("version: 1\noutput_dir: out\nroles:\n  trainer:\n    enabled: true\n"
                    "    ranks: all\n    regions: [train_step]\n"
                    "    torch: {activities: [cpu]}\n" + textwrap.indent(role, ""))
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), str(STEPS)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return tmp_path / "out", load_policy(path)


def written(out: Path) -> list[str]:
    suffix = ".pt.trace.json.gz"
    return sorted(str(p.relative_to(out))[: -len(suffix)] for p in out.rglob("*" + suffix))


def predicted(policy: Any) -> list[tuple[str, list[int]]]:
    """explain's traces of rank 1 over the same 40 steps: (name, steps)."""
    [rank] = [r for r in explain(policy, "trainer", world=2, lo=1, hi=STEPS, inner=1)["ranks"]
              if r["rank"] == 1]
    return [(t["name"], t["steps"]) for t in rank["traces"]]


def events(out: Path, trace: str) -> list[dict[str, Any]]:
    with gzip.open(out / f"{trace}.pt.trace.json.gz", "rt") as f:
        found: list[dict[str, Any]] = json.load(f)["traceEvents"]
    return found


@pytest.mark.parametrize(("role", "expected"), [
    (EVERY, [f"trainer_step{n}_rank1" for n in (5, 15, 25, 35)]),
    (TORCHTITAN, [f"iteration_{n}/rank1_trace" for n in (10, 20, 30, 40)]),
], ids=["every", "torchtitan"])
def test_a_periodic_policy_writes_exactly_the_expected_traces(
        tmp_path: Path, role: str, expected: list[str]) -> None:
    out, policy = run_child(tmp_path, role)
    assert written(out) == sorted(expected)
    records = [r for r in read_manifests(str(out)) if r.get("event") == "trace"]
    assert [r["path"] for r in records] == [f"{n}.pt.trace.json.gz" for n in expected]
    # explain over the same 40 steps: the same names, and the steps the manifest lists
    assert predicted(policy) == [(n, r["steps"]) for n, r in zip(expected, records,
                                                                  strict=True)]
    assert {r["status"] for r in records} == {"complete"}
    for name in expected:
        names = {e.get("name") for e in events(out, name)}
        assert "train_step" in names  # the region recorded in each trace
        assert any(str(n).startswith("aten::") for n in names)
    if role is TORCHTITAN:  # one capture; each trace recorded inner step 10k - 1
        assert len({r["capture"] for r in records}) == 1
        assert sorted(r["inner_steps"] for r in records) == [[9], [19], [29], [39]]
        assert sorted(r["cycle"] for r in records) == [0, 1, 2, 3]
        assert [r["steps"] for r in records] == [[10], [20], [30], [40]]  # the cycle's own
    else:
        assert sorted(r["steps"] for r in records) == [[5], [15], [25], [35]]
