"""The file names the docs and example comments show are the names the engine writes: each
is matched against ``Plan.capture_name`` (what the runtime and explain use) for the policy
the page shows, with ``<pid>`` and ``<timestamp>`` as any digits (or an ellipsis)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from policy_engine import Topology, compile_plan, load_policy

ROOT = Path(__file__).resolve().parent.parent


def yaml_after(page: str, heading: str) -> dict[str, object]:
    """The first YAML block of ``page`` after ``heading``."""
    text = (ROOT / page).read_text()
    block = text.split(heading, 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    found: dict[str, object] = yaml.safe_load(block)
    return found


def shown(name: str) -> re.Pattern[str]:
    """How a doc may show ``name``: late fields as real digits or as an ellipsis."""
    late = r"(?:\d+|…|\.\.\.)"
    parts = re.split(r"(<pid>|<timestamp>)", name)
    return re.compile("".join(late if p in ("<pid>", "<timestamp>") else re.escape(p)
                              for p in parts))


def name(data: dict[str, object] | str, role: str, rank: int, world: int, step: int) -> str:
    """The name ``role`` gives its capture of ``step`` on ``rank`` (no schedule cycles)."""
    plan = compile_plan(load_policy(data), role, Topology(rank=rank, world=world))
    return plan.capture_name(first=step, region=None, cycle=None)


@pytest.mark.parametrize(("rank", "step"), [(0, 2), (0, 3)])
def test_runtime_verl_worker_example(rank: int, step: int) -> None:
    data = yaml_after("docs/runtime.md", "## A verl-style worker")
    expected = shown(name(data, "actor", rank, 2, step))
    assert expected.pattern.startswith("actor\\+ref/step")
    assert expected.search((ROOT / "docs/runtime.md").read_text()), expected.pattern


@pytest.mark.parametrize("rank", [0, 2])
def test_distributed_torchrun_example(rank: int) -> None:
    data = yaml_after("docs/distributed.md", "## Worked examples")
    expected = shown(name(data, "actor", rank, 4, 2) + ".pt.trace.json.gz")
    assert expected.search((ROOT / "docs/distributed.md").read_text()), expected.pattern


def test_distributed_ray_example() -> None:
    data = yaml_after("docs/distributed.md", "Ray numbers nothing itself")
    text = (ROOT / "docs/distributed.md").read_text()
    for role, rank, world in (("actor", 0, 4), ("rollout", 1, 2)):
        full = name(data, role, rank, world, 2)
        assert f"`{full.split('<pid>')[0]}…`" in text, full


def test_the_verl_ppo_comment() -> None:
    path = ROOT / "policies" / "verl_ppo.yaml"
    full = name(str(path), "actor", 0, 8, 2)
    assert full.split("<pid>")[0] + "..._..." in path.read_text(), full
