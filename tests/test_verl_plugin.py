"""The verl plugin in one process: the role table, the switch, windows, stages, inner
steps and failures, on verl's real DistProfiler with the recording backend.

The multi-process comparison with verl's own profiler is tests/test_verl_e2e.py.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from job_env import child_env

from policy_engine.errors import PolicyError
from policy_engine.integrations import verl as plugin
from policy_engine.integrations.verl import driver as verl_driver
from policy_engine.integrations.verl.roles import ENV_ROLES, assign, env_mapping, stage_role
from policy_engine.language.load import ENV_FILE
from policy_engine.runtime.process import state
from policy_engine.testing import recording_backend

profile = pytest.importorskip("verl.utils.profiler.profile",
                              reason="verl is not installed (scripts/install_verl.sh)")
from verl.utils.profiler import DistProfiler, DistProfilerExtension, ProfilerConfig  # noqa: E402
from verl.utils.profiler.config import (  # noqa: E402
    PrecisionDebuggerToolConfig,
    TorchProfilerToolConfig,
)


# -- the role table -----------------------------------------------------------------------
@pytest.mark.parametrize(("worker", "roles", "expected"), [
    ("actor_rollout_ref", ["actor", "ref", "rollout"], ("actor", ("ref", "rollout"))),
    ("actor_rollout_ref", ["actor"], ("actor", ())),
    ("actor_rollout", ["actor", "ref", "rollout"], ("actor", ("rollout",))),
    ("ref", ["actor", "ref"], ("ref", ())),
    ("value_model", ["critic"], ("critic", ())),
    ("language_model", [], ("actor", ())),
    (None, ["rollout"], ("rollout", ())),
    ("reward_model", [], ("reward_model", ())),
    # A role named after the verl worker wins over the table.
    ("actor_rollout_ref", ["actor_rollout_ref", "actor"], ("actor_rollout_ref", ())),
])
def test_role_table(worker: str | None, roles: list[str],
                    expected: tuple[str, tuple[str, ...]]) -> None:
    found = assign(worker, roles, mapping={})
    assert (found.role, found.colocated) == expected


def test_environment_mapping_wins() -> None:
    mapping = env_mapping(" language_model=trainer , critic=value,")
    assert mapping == {"language_model": "trainer", "critic": "value"}
    found = assign("critic", ["critic", "value"], mapping=mapping)
    assert (found.role, found.how) == ("value", ENV_ROLES)


def test_environment_mapping_error() -> None:
    with pytest.raises(ValueError) as err:
        env_mapping("critic=value,actor")
    assert str(err.value) == ("PROFILE_POLICY_VERL_ROLES item 2 'actor' is not "
                              "VERL_NAME=ROLE (for example language_model=trainer)")


@pytest.mark.parametrize(("stage", "expected"), [
    ("ref_compute_log_prob", "ref"), ("actor_update", "actor"),
    ("train_batch", "actor"), ("critic_update", "actor")])
def test_stage_roles(stage: str, expected: str) -> None:
    assert stage_role(stage, {"actor": 0, "ref": 1}, "actor") == expected


def test_the_switch_is_the_languages() -> None:
    assert plugin.ENV_FILE == ENV_FILE


# -- the entry point ----------------------------------------------------------------------
PROBE = ("import verl; from verl.utils.profiler import DistProfiler; "
         "print(DistProfiler.__dict__.get('__policy_engine_patched__', False))")


@pytest.mark.slow  # pip reads every installed package's metadata: seconds
def test_install_verl_breaks_nothing_but_leaves_verls_extras_out() -> None:
    """scripts/install_verl.sh installs verl without what its profiler does not need (the
    script names those); nothing else installed is left with a requirement unmet (before,
    tensordict's pyvers took packaging below what virtualenv needs)."""
    done = subprocess.run([sys.executable, "-m", "pip", "check"], env=child_env(),
                          capture_output=True, text=True, timeout=180)
    left_out = re.compile(r"verl \S+ requires [\w.-]+, which is not installed\.")
    assert [line for line in done.stdout.splitlines() if not left_out.fullmatch(line)] == []


@pytest.mark.slow  # the process imports verl (Ray, transformers): seconds
def test_without_policy_import_verl_patches_nothing() -> None:
    """The plugin is loaded (the entry point is installed) and changes nothing. With
    PROFILE_POLICY set, the same entry point takes over: tests/test_verl_e2e.py."""
    probe = PROBE + "; import sys; print('policy_engine.integrations.verl' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], env=child_env(),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]


# -- one process, the recording backend ---------------------------------------------------
def hybrid(config: ProfilerConfig | None = None, tool: Any = None) -> Any:
    """A verl-shaped hybrid worker. Its classes are made here, after the plugin is
    installed, as verl's workers are made after `import verl` loads it: the stage decorator
    is the one DistProfiler has when the class body runs."""

    class Inner(DistProfilerExtension):
        def __init__(self, config: ProfilerConfig, tool: Any) -> None:
            DistProfilerExtension.__init__(self, DistProfiler(
                rank=0, config=config, tool_config=tool, save_file_prefix="language_model"))

        @DistProfiler.annotate(role="train_batch")
        def train_batch(self) -> None:
            pass

        def train_mini_batch(self, n: int) -> None:
            for _ in range(n):
                self.train_batch()
                self.profiler.step()


    class Hybrid(DistProfilerExtension):
        def __init__(self, config: ProfilerConfig | None = None, tool: Any = None) -> None:
            config = config or ProfilerConfig(tool="torch", enable=True, save_path="unused",
                                              tool_config={})
            tool = tool if tool is not None else TorchProfilerToolConfig(contents=["cpu"])
            DistProfilerExtension.__init__(self, DistProfiler(
                rank=0, config=config, tool_config=tool, save_file_prefix="actor_rollout_ref"))
            self.actor = Inner(config, tool)
            self.calls: list[str] = []
            self.fail: str | None = None

        def _ran(self, stage: str) -> None:
            self.calls.append(stage)
            if stage == self.fail:
                raise KeyError(stage)

        @DistProfiler.annotate(role="ref_compute_log_prob")
        def compute_ref_log_prob(self) -> None:
            self._ran("ref_compute_log_prob")

        @DistProfiler.annotate(role="actor_update", scheduled=True)
        def update_actor(self) -> None:
            self._ran("actor_update")
            self.actor.train_mini_batch(3)

        def step(self, n: int, profiled: bool) -> None:
            if profiled:
                self.start_profile(role="train", profile_step=n)
            self.compute_ref_log_prob()
            self.update_actor()
            if profiled:
                self.stop_profile(run_command=False)

    return Hybrid(config, tool)


@pytest.fixture
def policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """write(policy dict) -> path, with PROFILE_POLICY naming it and the plugin installed."""
    monkeypatch.chdir(tmp_path)

    def write(body: dict[str, Any]) -> Path:
        path = tmp_path / "profile_policy.yaml"
        path.write_text(yaml.safe_dump({"version": 1, "output_dir": "out", **body}))
        monkeypatch.setenv(ENV_FILE, str(path))
        assert plugin.install()
        return path
    yield write
    state.reset()


BASE = {"colocate": [["actor", "ref"]], "defaults": {"ranks": "all", "steps": [2]},
        "roles": {"actor": {"enabled": True}, "ref": {"enabled": True}}}


def trace_lines(root: Path) -> list[dict[str, Any]]:
    return [line for f in sorted((root / "out" / "manifests").glob("*.jsonl"))
            for line in map(json.loads, f.read_text().splitlines())
            if line["event"] in ("trace", "close")]


def test_windows_stages_and_inner_steps(policy: Any, tmp_path: Path) -> None:
    policy(BASE)
    with recording_backend("torch") as rec:
        worker = hybrid()
        for n in (1, 2, 3):
            worker.step(n, profiled=n in (2, 3))  # verl's steps: 2 and 3; the policy's: 2
    opened = [c for c in rec.calls if c[0] in ("open", "save")]
    assert [c[:2] if c[0] == "open" else (c[0], c[2]) for c in opened] == [
        ("open", "actor"), ("save", 0)]
    assert re.fullmatch(r"actor\+ref/step2/trace_rank0-of-1_pid\d+_\d{17}", opened[1][1])
    ranges = [c[1] for c in rec.calls if c[0] == "range_start"]
    assert ranges == ["ref_compute_log_prob", "actor_update", "train_batch", "train_batch",
                      "train_batch"]
    # Inner step 0 begins with the window; each of the three mini-batches ends one.
    assert [c[1] for c in rec.calls if c[0] == "step"] == [0, 1, 2, 3]
    assert worker.calls == ["ref_compute_log_prob", "actor_update"] * 3
    assert [line["roles"] for line in trace_lines(tmp_path) if line["event"] == "trace"] == \
        [["actor", "ref"]]


def test_the_takeover_is_said_once(policy: Any, caplog: pytest.LogCaptureFixture) -> None:
    policy(BASE)
    with caplog.at_level(logging.INFO, logger="policy_engine"), recording_backend("torch"):
        hybrid()
        hybrid()
    said = [r.getMessage() for r in caplog.records if "verl" in r.getMessage()]
    assert said == [
        "policy-engine: verl worker 'actor_rollout_ref' (Hybrid, rank 0) is profiled as "
        f"policy role 'actor' with ref in its windows (by the table), policy "
        f"{os.environ[ENV_FILE]}",
        "policy-engine: verl's inner 'language_model' profiler (Inner) hands its mini-batch "
        "steps and stages to its outer worker's role"]


def test_a_stage_that_raises_runs_once_and_saves_partial(policy: Any,
                                                        tmp_path: Path) -> None:
    policy({**BASE, "defaults": {**BASE["defaults"], "discrete": True},
            "roles": {"actor": {"enabled": True, "regions": ["actor_update"]},
                      "ref": {"enabled": True, "regions": ["ref_compute_log_prob"]}}})
    with recording_backend("torch") as rec:
        worker = hybrid()
        worker.step(1, profiled=False)
        worker.fail = "actor_update"
        with pytest.raises(KeyError):
            worker.step(2, profiled=True)
    assert worker.calls == ["ref_compute_log_prob", "actor_update"] * 2
    saved = [(line["region"], line["status"]) for line in trace_lines(tmp_path)
             if line["event"] == "trace"]
    assert saved == [("ref_compute_log_prob", "complete"), ("actor_update", "partial")]
    assert [c[0] for c in rec.calls].count("save") == 2


@pytest.mark.parametrize(("actor_regions", "owner"), [
    (["actor_update"], "ref"),                          # the label names the ref
    (["actor_update", "ref_compute_log_prob"], "actor"),  # verl's way: the actor's block
])
def test_which_role_a_colocated_stage_is(policy: Any, tmp_path: Path,
                                          actor_regions: list[str], owner: str) -> None:
    policy({**BASE, "defaults": {**BASE["defaults"], "discrete": True},
            "roles": {"actor": {"enabled": True, "regions": actor_regions},
                      "ref": {"enabled": True, "regions": ["ref_compute_log_prob"]}}})
    with recording_backend("torch"):
        hybrid().step(2, profiled=True)
    assert [(line["role"], line["region"]) for line in trace_lines(tmp_path)
            if line["event"] == "trace"] == [(owner, "ref_compute_log_prob"),
                                             ("actor", "actor_update")]


def test_a_profiler_failure_never_stops_training(policy: Any,
                                                caplog: pytest.LogCaptureFixture) -> None:
    policy(BASE)
    with recording_backend("torch", fail_on="start"):
        worker = hybrid()
        for n in (1, 2, 3):
            worker.step(n, profiled=True)
    assert worker.calls == ["ref_compute_log_prob", "actor_update"] * 3
    assert any("recording backend told to fail on start" in r.getMessage()
               for r in caplog.records)


CANNOT_SAY = [
    (ProfilerConfig(tool="precision_debugger", enable=True, save_path="x", tool_config={}),
     PrecisionDebuggerToolConfig(),
     "tool precision_debugger (msprobe's precision dumps) has no backend in the policy "
     "language"),
    (ProfilerConfig(tool="torch", enable=True, save_path="x", tool_config={}),
     TorchProfilerToolConfig(profile_token_start=10),
     "profile_token_start (a window of response tokens in the rollout engine) has no "
     "equivalent in the policy language"),
]
WHO = "verl worker 'actor_rollout_ref' (Hybrid, rank 0)"
OFF = ("; profiling is off in this process (verl's own profiler too) and training goes on")


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def trains_unprofiled(rec: Any) -> Any:
    """A hybrid worker built and trained through verl's steps 1-3; nothing recorded, and
    verl's own profiler not built either."""
    worker = hybrid()
    for n in (1, 2, 3):
        worker.step(n, profiled=True)
    assert worker.calls == ["ref_compute_log_prob", "actor_update"] * 3
    assert rec.calls == []
    assert type(worker.profiler._impl).__name__ == "_NoOpProfiler"
    return worker


@pytest.mark.parametrize(("config", "tool", "message"), CANNOT_SAY)
def test_what_the_policy_cannot_say_turns_profiling_off(
        policy: Any, config: ProfilerConfig, tool: Any, message: str,
        caplog: pytest.LogCaptureFixture) -> None:
    policy(BASE)
    with recording_backend("torch") as rec:
        worker = hybrid(config, tool)
        worker.step(2, profiled=True)
    assert worker.calls == ["ref_compute_log_prob", "actor_update"]
    assert rec.calls == []
    assert errors(caplog) == [
        f"policy-engine: {WHO} cannot be profiled: verl's profiler config asks for what the "
        f"policy cannot express: {message}; remove it from verl's profiler config or unset "
        f"PROFILE_POLICY{OFF}"]


@pytest.mark.parametrize(("config", "tool", "message"), CANNOT_SAY)
def test_what_the_policy_cannot_say_raises_under_on_error_raise(
        policy: Any, config: ProfilerConfig, tool: Any, message: str) -> None:
    policy({**BASE, "defaults": {**BASE["defaults"], "on_error": "raise"}})
    with pytest.raises(ValueError) as err:
        hybrid(config, tool)
    assert str(err.value) == (
        f"verl's profiler config asks for what the policy cannot express: {message}; remove "
        "it from verl's profiler config or unset PROFILE_POLICY")


TYPO = ("the worker's policy role is 'actor' (by the table), which the policy does not "
        "name; the policy's role 'actr' looks like a misspelling of it (did you mean "
        "'actor'?): rename it 'actor', or map the worker with "
        "PROFILE_POLICY_VERL_ROLES=actor_rollout_ref=actr")


def test_a_misspelt_role_turns_profiling_off_with_one_line(
        policy: Any, caplog: pytest.LogCaptureFixture) -> None:
    """`roles: {actr: ...}` validates (with a warning); the worker is still built and
    trains, and one line says what is wrong and what to do."""
    policy({"defaults": {"ranks": "all", "steps": [2]}, "roles": {"actr": {"enabled": True}}})
    with recording_backend("torch") as rec:
        trains_unprofiled(rec)
        trains_unprofiled(rec)  # the process stays off, without a second line
    assert errors(caplog) == [f"policy-engine: {WHO} cannot be profiled: {TYPO}{OFF}"]


def test_a_malformed_roles_variable_turns_profiling_off_with_one_line(
        policy: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(ENV_ROLES, "critic=value,actor")
    policy(BASE)
    with recording_backend("torch") as rec:
        trains_unprofiled(rec)
    assert errors(caplog) == [
        f"policy-engine: {WHO} cannot be profiled: PROFILE_POLICY_VERL_ROLES item 2 'actor' "
        f"is not VERL_NAME=ROLE (for example language_model=trainer){OFF}"]


@pytest.mark.parametrize(("roles", "body", "raised", "message"), [
    ("", {"roles": {"actr": {"enabled": True}}}, PolicyError, TYPO),
    ("critic=value,actor", BASE, ValueError,
     "PROFILE_POLICY_VERL_ROLES item 2 'actor' is not VERL_NAME=ROLE (for example "
     "language_model=trainer)"),
])
def test_under_on_error_raise_the_worker_is_not_built(
        policy: Any, monkeypatch: pytest.MonkeyPatch, roles: str, body: dict[str, Any],
        raised: type[Exception], message: str) -> None:
    """``on_error: raise`` in defaults (no role could be told, or the worker's role is not
    in the policy): the failure reaches verl, as the policy asks."""
    monkeypatch.setenv(ENV_ROLES, roles)
    policy({**body, "defaults": {"on_error": "raise", "steps": [2]}})
    with pytest.raises(raised) as err:
        hybrid()
    assert message in str(err.value)


def test_a_fault_in_a_window_turns_profiling_off_with_one_line(
        policy: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A step verl's caller passes that is no step number: the window cannot open; the
    open capture of another worker of the process is saved partial, and training goes
    on unprofiled in every worker."""
    policy(BASE)
    with recording_backend("torch") as rec:
        first, second = hybrid(), hybrid()
        first.start_profile(profile_step=2)
        second.start_profile(profile_step="second")
        first.update_actor()
        first.stop_profile(run_command=False)
        for n in (3, 4):
            second.step(n, profiled=True)
    assert second.calls == ["ref_compute_log_prob", "actor_update"] * 2
    assert errors(caplog) == [
        "policy-engine: verl worker 'actor_rollout_ref' (Hybrid, rank 0) cannot be profiled: "
        f"start_profile failed: the step verl passed, 'second', is no step number{OFF}"]
    assert [(line["status"]) for line in trace_lines(tmp_path) if line["event"] == "trace"] \
        == ["partial"]
    assert [c[0] for c in rec.calls].count("range_start") == 0  # nothing after the fault


def test_verl_config_is_kept_for_its_finish_hook(policy: Any) -> None:
    policy(BASE)
    config = ProfilerConfig(tool="torch", enable=True, ranks=[3], save_path="x",
                            tool_config={}, finish_hook_ranks=[0])
    worker = hybrid(config)
    prof = worker.profiler
    assert (prof.config, prof._tool, prof._this_rank, prof._finish_hook_this_rank) == \
        (config, "torch", False, True)
    assert type(prof._impl).__name__ == "_NoOpProfiler"  # verl's torch tool never built


def test_a_broken_policy_turns_all_profiling_off_with_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "profile_policy.yaml"
    path.write_text("version: 1\nroles: {actor: {enabled: maybe, ranks: x}}\n")
    monkeypatch.setenv(ENV_FILE, str(path))
    assert plugin.install()
    with recording_backend("torch") as rec:
        trains_unprofiled(rec)  # verl's own profiler is off too
    assert len(errors(caplog)) == 1
    assert errors(caplog)[0].startswith(
        f"policy-engine: {WHO} cannot be profiled: the policy PROFILE_POLICY={path} does not "
        f"load: {path}:2:")
    assert errors(caplog)[0].endswith(
        f"(and 1 more); `policy-engine validate {path}` (with the same PROFILE_POLICY_SET) "
        f"lists every problem{OFF}")
    assert "enabled must be a boolean" in errors(caplog)[0]
    state.reset()


def test_a_rollout_replica_of_an_engine_role_records_nothing(
        policy: Any, caplog: pytest.LogCaptureFixture) -> None:
    policy({"roles": {"rollout": {"enabled": True, "backend": "vllm", "steps": [2]}}})
    config = ProfilerConfig(tool="torch", enable=True, save_path="x", tool_config={})
    with caplog.at_level(logging.INFO, logger="policy_engine"), \
            recording_backend("torch") as rec:
        replica = profile.build_rollout_dist_profiler(0, 2, config=config,
                                                     tool_config=TorchProfilerToolConfig())
        replica.start(profile_step=2)
        replica.step()
        replica.stop(run_command=False)
    assert rec.calls == []
    assert "policy role 'rollout', whose backend vllm runs in the inference engine" in \
        caplog.text


def test_no_outer_window_no_step(policy: Any) -> None:
    policy(BASE)
    with recording_backend("torch") as rec:
        worker = hybrid()
        worker.step(1, profiled=False)
    assert rec.calls == []
    assert verl_driver.outer_driver() is not None
