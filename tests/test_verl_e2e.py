"""verl's own profiler against the plugin, on two torchrun ranks with gloo.

tests/verl_scripts/verl_worker.py is one verl-shaped job (verl's real DistProfiler,
DistProfilerExtension and @DistProfiler.annotate; the hybrid actor+ref worker, its inner
TrainingWorker stepping once per mini-batch, a trainer calling start_profile/stop_profile
at global_profiler.steps). Each test runs it once with verl's torch profiler and once with
PROFILE_POLICY set, so that the plugin (reached through `import verl` and the installed
entry point) drives the same code, and compares what each wrote.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from job_env import child_env, run_cli
from npu_fixtures import FAKE_ROOT

pytest.importorskip("verl.utils.profiler", reason="verl is not installed (scripts/install_verl.sh)")

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "verl_scripts" / "verl_worker.py"
TIMEOUT = 300
#: verl's torch trace names: <prefix>_<role>_step<N>_rank<R>-of-<W>_pid<P>_<time>[_mb<A>-<B>],
#: each part with `_` made `-`.
VERL_NAME = re.compile(r"actor-rollout-ref_(?P<stage>[a-z-]+)_step(?P<step>\d+)_rank(?P<rank>\d+)"
                       r"-of-2_pid\d+_\d+(?:_mb[\d-]+)?\.json\.gz")
STAGES = ("actor_compute_log_prob", "ref_compute_log_prob", "actor_update")
HOOK = "echo done > $VERL_PROFILE_SAVE_PATH/hook_rank$VERL_PROFILE_RANK"


class Job:
    """What one run of the verl-shaped job left: reports, verl's save_path, the policy's
    output folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.save = root / "save"
        self.out = root / "out"
        self.reports = root / "reports"
        self.log = ""  # the job's stdout and stderr

    def report(self, rank: int) -> dict[str, Any]:
        return json.loads((self.reports / f"report{rank}.json").read_text())

    def hooks(self) -> set[str]:
        return {p.name for p in self.save.glob("hook_rank*")}

    def trace_lines(self) -> list[dict[str, Any]]:
        return [line for f in sorted((self.out / "manifests").glob("*.jsonl"))
                for line in map(json.loads, f.read_text().splitlines())
                if line["event"] == "trace"]


def run_job(root: Path, cfg: Mapping[str, Any], policy: Mapping[str, Any] | None = None,
            env: Mapping[str, str] | None = None, pythonpath: str | None = None) -> Job:
    job = Job(root)
    for folder in (job.save, job.reports):
        folder.mkdir(parents=True)
    full = {"total_steps": 3, "mini_batches": 4, "finish_hook_cmd": HOOK, **cfg,
            "save_path": str(job.save), "report_dir": str(job.reports)}
    run_env = {**child_env(), **(env or {})}
    if pythonpath:
        run_env["PYTHONPATH"] = os.pathsep.join([pythonpath, run_env["PYTHONPATH"]])
    if policy is not None:
        path = root / "profile_policy.yaml"
        path.write_text(yaml.safe_dump({"version": 1, "output_dir": str(job.out), **policy}))
        run_env["PROFILE_POLICY"] = str(path)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(WORKER), json.dumps(full)],
        cwd=root, env=run_env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    job.log = done.stdout + done.stderr
    return job


def annotations(path: Path) -> set[str]:
    """The names of the ranges (record_function, user annotations) in a torch trace."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return {e["name"] for e in events if e.get("cat") == "user_annotation"}


def verl_traces(job: Job) -> dict[tuple[str, int, int], set[str]]:
    """verl's traces by (stage or 'train', step, rank) -> range names."""
    found = {}
    for path in job.save.glob("*.json.gz"):
        match = VERL_NAME.fullmatch(path.name)
        assert match, path.name
        stage = match["stage"].replace("-", "_")
        found[stage, int(match["step"]), int(match["rank"])] = annotations(path)
    return found


def plugin_traces(job: Job) -> dict[tuple[str, int, int], set[str]]:
    """The plugin's traces by (region or 'train', step, rank) -> range names."""
    return {(line["region"] or "train", line["steps"][0], line["rank"]):
            annotations(job.out / line["path"]) for line in job.trace_lines()}


def mini_batches(names: set[str]) -> set[str]:
    return {n for n in names if re.fullmatch(r"mini_batch\d+", n)}


def explained(job: Job, roles: tuple[str, ...], *extra: str) -> set[str]:
    """Every file explain predicts for ``roles`` over steps 1-3, as path patterns."""
    policy = job.root / "profile_policy.yaml"
    patterns = set()
    for role in roles:
        done = run_cli("explain", str(policy), "--role", role, "--world", "2", "--steps",
                       "1-3", "--format", "json", *extra, cwd=job.root, timeout=60)
        assert done.returncode == 0, done.stderr
        for rank in json.loads(done.stdout)["ranks"]:
            for trace in rank.get("traces", []):
                patterns |= {f["path"].rstrip("/") for f in trace["files"]}  # folders end in /
    return patterns


def assert_explained(job: Job, roles: tuple[str, ...], *extra: str) -> None:
    """explain's files are exactly the manifest's traces, and every file on disk is one."""
    predicted = explained(job, roles, *extra)
    written = sorted(line["path"] for line in job.trace_lines())
    regexes = [re.compile(re.escape(p).replace(re.escape("<pid>"), r"\d+")
                          .replace(re.escape("<timestamp>"), r"\d{17}")
                          .replace(re.escape("<npu_timestamp>"), r"\d+")) for p in predicted]
    unmatched = [w for w in written if not any(r.fullmatch(w) for r in regexes)]
    assert not unmatched, (unmatched, sorted(predicted))
    assert len(written) == len(predicted), (written, sorted(predicted))
    on_disk = {p.relative_to(job.out).as_posix() for p in job.out.rglob("*")
               if p.is_file() and p.parent.name != "manifests"}
    assert all(any(f == w or f.startswith(w + "/") for w in written) for f in on_disk)


COLOCATED = {"colocate": [["actor", "ref"]],
             "defaults": {"backend": "torch", "torch": {"activities": ["cpu"]}}}


# -- continuous: one window per profiled step --------------------------------------------
CONTINUOUS = {"steps": [2, 3], "ranks": [1]}
CONTINUOUS_POLICY = {**COLOCATED, "roles": {
    "actor": {"enabled": True, "ranks": [1], "steps": [2, 3]},
    "ref": {"enabled": True, "ranks": [1], "steps": [2, 3]}}}


@pytest.fixture(scope="module")
def continuous(tmp_path_factory: pytest.TempPathFactory) -> tuple[Job, Job]:
    verl = run_job(tmp_path_factory.mktemp("verl"), CONTINUOUS)
    plugin = run_job(tmp_path_factory.mktemp("plugin"), CONTINUOUS, CONTINUOUS_POLICY)
    return verl, plugin


def test_same_steps_ranks_stages_and_mini_batches(continuous: tuple[Job, Job]) -> None:
    verl, plugin = continuous
    ours, theirs = plugin_traces(plugin), verl_traces(verl)
    assert set(ours) == set(theirs) == {("train", 2, 1), ("train", 3, 1)}
    for key, names in theirs.items():
        assert {*STAGES, "mini_batch0", "mini_batch3"} <= names
        assert mini_batches(ours[key]) == mini_batches(names)
        assert set(STAGES) <= ours[key]


def test_colocated_roles_share_one_window(continuous: tuple[Job, Job]) -> None:
    _, plugin = continuous
    lines = plugin.trace_lines()
    assert [(line["role"], line["roles"], line["path"].split("/")[0]) for line in lines] == \
        [("actor", ["actor", "ref"], "actor+ref")] * 2


def test_finish_hook_runs_on_the_same_ranks(continuous: tuple[Job, Job]) -> None:
    verl, plugin = continuous
    assert verl.hooks() == plugin.hooks() == {"hook_rank1"}


def test_plugin_says_which_worker_it_took_over(continuous: tuple[Job, Job]) -> None:
    _, plugin = continuous
    log = plugin.log
    assert "policy-engine: verl worker 'actor_rollout_ref' (ActorRolloutRefWorker, rank 1) " \
           "is profiled as policy role 'actor' with ref in its windows (by the table)" in log


def test_explain_predicts_every_file(continuous: tuple[Job, Job]) -> None:
    assert_explained(continuous[1], ("actor", "ref"))


def test_without_policy_the_plugin_changes_nothing(
        continuous: tuple[Job, Job], tmp_path: Path) -> None:
    verl, _ = continuous
    bare = run_job(tmp_path, CONTINUOUS, env={"VERL_USE_EXTERNAL_PLUGINS": "none"})
    assert verl_traces(bare) == verl_traces(verl)
    assert bare.hooks() == verl.hooks()
    assert not verl.out.exists()


# -- discrete: each stage its own capture, a schedule on the update stage -----------------
SCHEDULE = {"wait": 1, "active": 2, "repeat": 1}
DISCRETE = {"steps": [2], "total_steps": 2, "all_ranks": True, "discrete": True,
            "schedule": SCHEDULE}
DISCRETE_POLICY = {**COLOCATED, "defaults": {**COLOCATED["defaults"], "discrete": True,
                                             "ranks": "all", "steps": [2]},
                   "roles": {
                       "actor": {"enabled": True, "regions": {
                           "actor_compute_log_prob": {}, "actor_update": {"schedule": SCHEDULE}}},
                       "ref": {"enabled": True, "regions": ["ref_compute_log_prob"]}}}


def test_discrete_schedule_keeps_the_same_mini_batches(tmp_path: Path) -> None:
    verl = run_job(tmp_path / "verl", DISCRETE)
    plugin = run_job(tmp_path / "plugin", DISCRETE, DISCRETE_POLICY)
    ours, theirs = plugin_traces(plugin), verl_traces(verl)
    assert set(ours) == set(theirs) == {(s, 2, r) for s in STAGES for r in (0, 1)}
    for (stage, _, rank), names in theirs.items():
        assert stage in ours[stage, 2, rank]
        assert mini_batches(ours[stage, 2, rank]) == mini_batches(names)
    assert mini_batches(theirs["actor_update", 2, 0]) == {"mini_batch1", "mini_batch2"}
    assert_explained(plugin, ("actor", "ref"), "--inner-steps", "4")


# -- an exception inside a stage --------------------------------------------------------
def test_exception_in_a_stage_saves_the_capture_and_runs_it_once(tmp_path: Path) -> None:
    cfg = {**CONTINUOUS, "fail": "actor_update"}
    plugin = run_job(tmp_path, cfg, CONTINUOUS_POLICY)
    for rank in (0, 1):
        report = plugin.report(rank)
        assert report["outcome"] == "raised: planted failure in actor_update"
        assert report["calls"]["actor_update"] == 3
    lines = {line["steps"][0]: line for line in plugin.trace_lines()}
    assert (lines[2]["status"], lines[3]["status"]) == ("complete", "partial")
    assert {"actor_compute_log_prob", "actor_update"} <= annotations(
        plugin.out / lines[3]["path"])
    assert_explained(plugin, ("actor", "ref"))


# -- Ascend: verl's npu tool, the policy's mstx backend, the fake torch_npu ----------------
def test_ascend_through_the_plugin(tmp_path: Path) -> None:
    policy = {"colocate": [["actor", "ref"]],
              "defaults": {"backend": "mstx", "ranks": "all", "steps": [2],
                           "mstx": {"activities": ["cpu"]}},
              "roles": {"actor": {"enabled": True}, "ref": {"enabled": True}}}
    plugin = run_job(tmp_path, {"steps": [2], "total_steps": 2, "all_ranks": True,
                                "tool": "npu"}, policy, pythonpath=FAKE_ROOT)
    lines = plugin.trace_lines()
    assert sorted((line["rank"], line["steps"], line["roles"]) for line in lines) == \
        [(0, [2], ["actor", "ref"]), (1, [2], ["actor", "ref"])]
    assert all(line["path"].endswith("_ascend_pt") for line in lines)
    assert plugin.hooks() == {"hook_rank0", "hook_rank1"}
    assert_explained(plugin, ("actor", "ref"))
