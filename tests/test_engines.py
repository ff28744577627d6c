"""The rollout-engine driver against the stand-in engines: the example policy end to end,
replicas and ranks, both engines, async engines and their loops, a stop that hangs."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gzip
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_engines import sglang as fake_sglang
from fake_engines import vllm as fake_vllm

from policy_engine import apply_policy as apply_worker_policy
from policy_engine.analysis.manifests import scan_manifests
from policy_engine.backends.engine import files as engine_files
from policy_engine.backends.vllm import checks as vllm_checks
from policy_engine.cli.engine_args import build as engine_args
from policy_engine.cli.main import main
from policy_engine.files.layout import MANIFEST_DIR
from policy_engine.integrations.engines import OffEngineProfiler, apply_engine_policy
from policy_engine.language.load import load_policy
from policy_engine.plan.predict import explain
from policy_engine.plan.topology import Topology

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "policies" / "verl_rollout_engines.yaml"


def _example(tmp_path: Path) -> dict[str, Any]:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["output_dir"] = str(tmp_path / "out")
    data.pop("$schema", None)
    return data


def _rollout_only(policy: dict[str, Any], **rollout: Any) -> dict[str, Any]:
    """The example's rollout alone, on a mesh of its own."""
    policy.pop("mesh")
    policy["roles"].pop("actor")
    policy["roles"]["rollout"].update(rollout)
    return policy


def _llms(policy: dict[str, Any], count: int, **kw: Any) -> list[fake_vllm.LLM]:
    """Stand-in engines started with what engine-args prints for the policy."""
    config = engine_args(load_policy(policy), "rollout")["profiler_config"]
    return [fake_vllm.LLM(profiler_config=config, **kw) for _ in range(count)]


def _lines(out: Path, **match: Any) -> list[dict[str, Any]]:
    return [r for r in scan_manifests(str(out)).records
            if all(r.get(k) == v for k, v in match.items())]


def _pattern(name: str) -> re.Pattern[str]:
    """explain's name, its run-time placeholders (<pid>, <timestamp>) as wildcards."""
    parts = re.split(r"(<[a-z:_]+>)", name)
    return re.compile("".join("[^/]+" if p.startswith("<") else re.escape(p) for p in parts))


def test_example_policy_end_to_end(tmp_path: Path) -> None:
    policy = _example(tmp_path)
    out = tmp_path / "out"
    llms = _llms(policy, 4, tensor_parallel_size=2)
    rollout = apply_engine_policy(llms, role="rollout", policy=policy)

    class Actor:
        def update_actor(self) -> None:
            import torch
            torch.ones(4) @ torch.ones(4)

        def compute_log_prob(self) -> None:
            pass
    actor = Actor()
    actor_prof = apply_worker_policy(actor, "actor", policy,
                                     Topology(0, 8, coords={"dp": 0}, sizes={"dp": 8}))
    for step in range(1, 5):
        with rollout.training_step(step):
            llms[0].generate(["a"] * 30)
        with actor_prof.training_step(step):
            actor.update_actor()
            actor.compute_log_prob()
    actor_prof.close()

    # Only the first replica was driven, with a prefix per step and the schedule mapped.
    starts = [kw for what, kw in llms[0].workers.calls if what == "start"]
    assert [s["delay_iterations"] for s in starts] == [8, 8]
    assert [s["max_iterations"] for s in starts] == [16, 16]
    assert starts[0]["profile_prefix"] != starts[1]["profile_prefix"]
    assert re.fullmatch(vllm_checks_prefix(), starts[0]["profile_prefix"])
    assert all(not llm.workers.calls for llm in llms[1:])

    # Every file explain predicts is there, and nothing else.
    predicted = explain(load_policy(policy), "rollout", world=8, lo=1, hi=4)
    names = [t["name"] for r in predicted["ranks"] if r["profiled"] for t in r["traces"]]
    assert len(names) == 4  # ranks 0 and 1, steps 2 and 3
    written = sorted(str(p.relative_to(out)) for p in (out / "rollout").rglob("*.pt.trace.json.gz")
                     if ".engine" not in p.parts)
    assert len(written) == 4
    for name in names:
        assert [w for w in written if _pattern(name + ".pt.trace.json.gz").fullmatch(w)], name
    assert not list((out / "rollout" / ".engine").iterdir())  # everything moved

    # The manifest: one capture per engine rank and step, with its coordinates checked.
    traces = _lines(out, event="trace", role="rollout")
    assert sorted((t["rank"], t["steps"][0]) for t in traces) == [(0, 2), (0, 3), (1, 2), (1, 3)]
    assert all(t["status"] == "complete" for t in traces)
    assert {t["extra"]["engine"]["tp"] for t in traces} == {0, 1}
    assert all(t["coords"] == {"dp": 0, "tp": t["rank"]} for t in traces)
    ids = {t["capture"] for t in traces}
    closes = [c for c in _lines(out, event="close") if c["capture"] in ids]
    assert len(closes) == 4 and all(c["status"] == "complete" for c in closes)
    actor_traces = _lines(out, event="trace", role="actor")
    assert sorted(t["steps"][0] for t in actor_traces) == [2, 3]

    # merge sees the rollout window beside the actor's.
    merged = tmp_path / "rollout2.pt.trace.json.gz"
    assert main(["merge", str(out), "--role", "rollout", "--step", "2", "-o", str(merged)]) == 0
    events = json.loads(gzip.decompress(merged.read_bytes()))["traceEvents"]
    assert {e.get("pid") for e in events if e.get("ph") == "X"}
    assert main(["traces", str(out)]) == 0


def vllm_checks_prefix() -> str:
    return r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"


def test_one_engine_for_every_replica_maps_files_by_dp(tmp_path: Path) -> None:
    policy = _rollout_only(_example(tmp_path), mesh={"dp": 2, "tp": 2}, ranks="all",
                           schedule=None)
    llm = _llms(policy, 1, tensor_parallel_size=2, data_parallel_size=2)[0]
    prof = apply_engine_policy(llm, policy=policy)
    with prof.training_step(2):
        pass
    traces = _lines(tmp_path / "out", event="trace", role="rollout")
    got = {t["rank"]: (t["extra"]["engine"]["dp"], t["extra"]["engine"]["tp"]) for t in traces}
    assert got == {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)}
    assert all(t["status"] == "complete" for t in traces)


def test_files_outside_the_mesh_are_reported(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    policy = _rollout_only(_example(tmp_path), mesh={"dp": 1, "tp": 2}, ranks="all")
    llm = _llms(policy, 1, tensor_parallel_size=4)[0]  # the engine runs tp=4, not 2
    with apply_engine_policy(llm, policy=policy).training_step(2):
        pass
    assert "outside" in caplog.text or "no selected rank" in caplog.text
    traces = _lines(tmp_path / "out", event="trace", role="rollout")
    assert sorted(t["status"] for t in traces) == ["complete", "complete"]


def test_a_stop_that_hangs_is_bounded_and_recorded_failed(tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    policy = _example(tmp_path)
    llms = _llms(policy, 4, tensor_parallel_size=2, stop_seconds=600.0)
    prof = apply_engine_policy(llms, policy=policy, timeout=2.0)
    try:
        with prof.training_step(2):
            pass
        # the step ended with every stop still under way: the 600 s were not waited for
        assert [llm.workers.stops_returned for llm in llms] == [0, 0, 0, 0]
        traces = _lines(tmp_path / "out", event="trace", role="rollout")
        assert {t["status"] for t in traces} == {"failed"}
        assert all("did not return within 2 s" in t["error"] for t in traces)
        assert "did not return" in caplog.text
        with prof.training_step(3):  # the engine is still busy: refused, not queued
            pass
        later = [t for t in _lines(tmp_path / "out", event="trace") if t["steps"] == [3]]
        assert later and all("has not returned" in t["error"] for t in later)
    finally:  # only now do the hung stops return (before, step 3 could find them done)
        for llm in llms:
            llm.workers.released.set()


def test_on_error_raise(tmp_path: Path) -> None:
    from policy_engine.errors import ProfilingError
    policy = _example(tmp_path)
    policy["roles"]["rollout"]["on_error"] = "raise"
    llms = [fake_vllm.LLM() for _ in range(4)]  # launched without a profiler
    prof = apply_engine_policy(llms, policy=policy)
    with pytest.raises(ProfilingError, match="Profiling is not enabled"), \
            prof.training_step(2):
        pass


def test_async_engine_awaited_on_its_loop(tmp_path: Path) -> None:
    policy = _example(tmp_path)
    config = engine_args(load_policy(policy), "rollout")["profiler_config"]
    config["ignore_frontend"] = False
    engines = [fake_vllm.AsyncLLM(profiler_config=config, tensor_parallel_size=2)
               for _ in range(4)]
    prof = apply_engine_policy(engines, policy=policy)

    async def loop() -> None:
        for step in (1, 2, 3):
            async with prof.atraining_step(step):
                await engines[0].generate("x")
    asyncio.run(loop())
    traces = _lines(tmp_path / "out", event="trace", role="rollout")
    assert len(traces) == 4 and {t["status"] for t in traces} == {"complete"}
    notes = _lines(tmp_path / "out", event="note", note="engine-frontend")
    assert len(notes) == 2 and "/frontend/" in notes[0]["path"]


def test_blocking_calls_reach_an_engine_loop_in_another_thread(tmp_path: Path) -> None:
    policy = _example(tmp_path)
    config = engine_args(load_policy(policy), "rollout")["profiler_config"]
    engine = fake_vllm.AsyncLLM(profiler_config=config, tensor_parallel_size=2)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(engine.generate("bind"), loop).result(10)
        prof = apply_engine_policy(engine, policy=policy, replica=0, loop=loop)
        with prof.training_step(2):
            pass
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    traces = _lines(tmp_path / "out", event="trace", role="rollout")
    assert {t["status"] for t in traces} == {"complete"} and len(traces) == 2


def test_a_blocking_call_inside_the_engine_loop_is_refused(tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    policy = _example(tmp_path)
    config = engine_args(load_policy(policy), "rollout")["profiler_config"]
    engine = fake_vllm.AsyncLLM(profiler_config=config, tensor_parallel_size=2)
    prof = apply_engine_policy(engine, policy=policy, replica=0)

    async def inside() -> None:
        with prof.training_step(2):  # a blocking call here would deadlock the loop
            await engine.generate("x")
    asyncio.run(inside())
    traces = _lines(tmp_path / "out", event="trace", role="rollout")
    assert {t["status"] for t in traces} == {"failed"}
    assert "atraining_step" in traces[0]["error"]


def _sglang_policy(tmp_path: Path, **rollout: Any) -> dict[str, Any]:
    body = {"enabled": True, "backend": "sglang", "mesh": {"dp": 2, "tp": 2},
            "ranks": {"dp": 1}, "steps": [2]}
    body.update(rollout)
    return {"version": 1, "prefix": "sg", "output_dir": str(tmp_path / "out"),
            "roles": {"rollout": body}}


def test_sglang_engine_by_stage_stops_itself(tmp_path: Path) -> None:
    policy = _sglang_policy(tmp_path, discrete=True, regions=["extend", "decode"],
                            schedule={"active": 3, "repeat": 1},
                            sglang={"profile_by_stage": True})
    engines = [fake_sglang.Engine(tp_size=2) for _ in range(2)]
    prof = apply_engine_policy(engines, policy=policy)
    for step in (1, 2):
        with prof.training_step(step):
            engines[1].generate(["p"] * 5)  # num_steps=3: the engine stops by itself
    req = engines[1].schedulers.requests[0]
    assert req.num_steps == 3 and req.profile_by_stage and req.output_dir.startswith("/")
    assert not engines[0].schedulers.requests
    traces = _lines(tmp_path / "out", event="trace", role="rollout")
    assert sorted((t["rank"], t["region"]) for t in traces) == [
        (2, "decode"), (2, "extend"), (3, "decode"), (3, "extend")]
    assert {t["status"] for t in traces} == {"complete"}
    predicted = explain(load_policy(policy), "rollout", world=4, lo=1, hi=3)
    names = [t["name"] for r in predicted["ranks"] if r["profiled"] for t in r["traces"]]
    paths = [t["path"] for t in traces]
    assert len(names) == 4
    for name in names:
        assert [p for p in paths if _pattern(name + ".pt.trace.json.gz").fullmatch(p)], name
    for engine in engines:
        engine.shutdown()


def test_sglang_memory_snapshots_join_the_layout(tmp_path: Path) -> None:
    policy = _sglang_policy(tmp_path, mesh={"tp": 2}, ranks="all",
                            sglang={"activities": ["CPU", "GPU", "MEM"]})
    engine = fake_sglang.Engine(tp_size=2)
    with apply_engine_policy(engine, policy=policy).training_step(2):
        pass
    traces = _lines(tmp_path / "out", event="trace", role="rollout")
    kinds = sorted((t["rank"], t["extra"]["kind"]) for t in traces)
    assert kinds == [(0, "memory"), (0, "trace"), (1, "memory"), (1, "trace")]
    assert all((tmp_path / "out" / t["path"]).is_file() for t in traces)
    engine.shutdown()


def test_role_off_and_wrong_backend(tmp_path: Path) -> None:
    policy = _example(tmp_path)
    policy["roles"]["rollout"]["enabled"] = False
    assert isinstance(apply_engine_policy(fake_vllm.LLM(), policy=policy), OffEngineProfiler)
    with pytest.raises(ValueError, match="not an engine"):
        apply_engine_policy(fake_vllm.LLM(), role="actor", policy=_example(tmp_path))
    with pytest.raises(ValueError, match="one engine per replica"):
        apply_engine_policy([fake_vllm.LLM()], policy=_example(tmp_path))
    with pytest.raises(TypeError, match="start_profile"):
        apply_engine_policy(object(), policy=_example(tmp_path))


def test_the_former_name_still_drives_and_warns(tmp_path: Path) -> None:
    from policy_engine.integrations import engines

    policy = _rollout_only(_example(tmp_path), mesh={"tp": 2}, ranks="all", schedule=None,
                           steps=[2])
    llm = _llms(policy, 1, tensor_parallel_size=2)[0]
    with pytest.warns(DeprecationWarning, match="now apply_engine_policy"):
        prof = engines.apply_policy(llm, policy=policy)
    assert isinstance(prof, engines.EngineProfiler)
    with prof.training_step(2):
        pass
    assert [what for what, _ in llm.workers.calls] == ["start", "stop"]
    traces = _lines(tmp_path / "out", event="trace", role="rollout")
    assert [t["status"] for t in traces] == ["complete", "complete"]  # one per tp rank


def test_worker_apply_policy_names_the_driver(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    policy = _example(tmp_path)
    prof = apply_worker_policy(object(), "rollout", copy.deepcopy(policy),
                               Topology(0, 8, coords={"dp": 0, "tp": 0},
                                        sizes={"dp": 4, "tp": 2}))
    try:
        with prof.training_step(2):
            pass
    finally:
        prof.close()  # rank 0 of 8: its listener thread (the job's clock) ends with it
    assert "policy_engine.integrations.engines" in caplog.text


def test_launch_config_fields() -> None:
    spec = load_policy(str(EXAMPLE)).role("rollout")
    config = vllm_checks.launch_config(spec.settings, spec.schedule, "/abs")
    assert config["warmup_iterations"] == 2 and config["active_iterations"] == 16
    assert config["torch_profiler_record_shapes"] is True
    assert os.path.isabs(config["torch_profiler_dir"])


def test_merged_steps_keep_one_session_and_an_exception_leaves_it_partial(
        tmp_path: Path) -> None:
    policy = _rollout_only(_example(tmp_path), mesh={"tp": 2}, ranks="all", schedule=None,
                           steps=[2, 3, 5], merge_steps=True)
    llm = _llms(policy, 1, tensor_parallel_size=2)[0]
    prof = apply_engine_policy(llm, policy=policy)
    for step in (1, 2, 3, 4):
        with prof.training_step(step):
            pass
    with pytest.raises(KeyError), prof.training_step(5):
        raise KeyError("generation failed")
    assert [what for what, _ in llm.workers.calls] == ["start", "stop", "start", "stop"]
    traces = _lines(tmp_path / "out", event="trace", role="rollout")
    assert sorted((t["steps"], t["status"]) for t in traces) == [
        ([2, 3], "complete"), ([2, 3], "complete"), ([5], "partial"), ([5], "partial")]
    assert all(t["path"].startswith(("rollout/step2-3/", "rollout/step5/")) for t in traces)


def test_an_engine_window_goes_through_a_captures_one_lifecycle(tmp_path: Path) -> None:
    # Each engine rank's capture is written as a role's capture is: open (who, where,
    # when), a trace line per file, close; down to how a long merged window lists its
    # steps (the first, the last and how many, past 64).
    policy = _rollout_only(_example(tmp_path), mesh={"tp": 2}, ranks="all", schedule=None,
                           steps=["1-70"], merge_steps=True)
    llm = _llms(policy, 1, tensor_parallel_size=2)[0]
    prof = apply_engine_policy(llm, policy=policy)
    for step in range(1, 71):
        with prof.training_step(step):
            pass
    assert [what for what, _ in llm.workers.calls] == ["start", "stop"]
    records = [json.loads(line) for path in (tmp_path / "out" / MANIFEST_DIR).iterdir()
               for line in path.read_text().splitlines()]  # as written
    captures = {r["capture"] for r in records}
    assert len(captures) == 2  # one per tp rank
    for capture in captures:
        lines = {r["event"]: r for r in records if r["capture"] == capture}
        assert set(lines) == {"open", "trace", "close"}
        assert {"host", "thread", "start", "engine_prefix"} <= set(lines["open"])
        assert lines["open"]["steps"] == [1]
        for event in ("trace", "close"):
            assert (lines[event]["steps"], lines[event]["step_count"]) == ([1, 70], 70)
        assert (lines["close"]["status"], lines["close"]["traces"]) == ("complete", 1)


def test_an_engine_launched_with_other_settings_is_named(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    policy = _example(tmp_path)
    config = engine_args(load_policy(policy), "rollout")["profiler_config"]
    stale = dict(config, warmup_iterations=0, torch_profiler_record_shapes=False)
    engines = [fake_vllm.AsyncLLM(profiler_config=stale, tensor_parallel_size=2)]
    engines += [fake_vllm.AsyncLLM(profiler_config=config, tensor_parallel_size=2)
                for _ in range(3)]
    apply_engine_policy(engines, policy=policy)
    assert "warmup_iterations=0 (the policy: 2)" in caplog.text
    assert "torch_profiler_record_shapes=False (the policy: True)" in caplog.text


def test_a_merged_window_the_loop_leaves_ends_and_close_ends_the_last(tmp_path: Path) -> None:
    policy = _rollout_only(_example(tmp_path), mesh={"tp": 2}, ranks="all", schedule=None,
                           steps=["2-3", 6, 7], merge_steps=True)
    llm = _llms(policy, 1, tensor_parallel_size=2)[0]
    prof = apply_engine_policy(llm, policy=policy)
    for step in (1, 2, 4, 6):  # step 3 never comes; the loop ends inside 6-7
        with prof.training_step(step):
            pass
    prof.close()
    traces = _lines(tmp_path / "out", event="trace", role="rollout")
    assert sorted((t["steps"], t["status"]) for t in traces) == [
        ([2], "complete"), ([2], "complete"), ([6], "partial"), ([6], "partial")]


def test_an_awaited_stop_that_hangs_is_bounded(tmp_path: Path) -> None:
    policy = _example(tmp_path)
    config = engine_args(load_policy(policy), "rollout")["profiler_config"]
    engine = fake_vllm.AsyncLLM(profiler_config=config, tensor_parallel_size=2,
                                stop_seconds=600.0)
    prof = apply_engine_policy(engine, policy=policy, replica=0, timeout=1.0)

    async def loop() -> int:
        try:
            async with prof.atraining_step(2):
                pass
            return engine.workers.stops_returned  # 0: the stop was not waited for
        finally:
            engine.workers.released.set()  # asyncio.run waits for the stop's thread
    assert asyncio.run(loop()) == 0
    traces = _lines(tmp_path / "out", event="trace", role="rollout")
    assert {t["status"] for t in traces} == {"failed"}
    assert "did not return within 1 s" in traces[0]["error"]


def test_a_profiler_folder_linked_out_is_recorded_and_the_loop_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    policy = _example(tmp_path)
    prof = apply_engine_policy(_llms(policy, 4, tensor_parallel_size=2), policy=policy)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    staging = tmp_path / "out" / "rollout" / ".engine"
    staging.parent.mkdir(parents=True)
    staging.symlink_to(elsewhere)  # the engine's folder, planted as a link out
    ran = []
    for n in range(1, 5):
        with prof.training_step(n):
            ran.append(n)
    assert ran == [1, 2, 3, 4]
    assert list(elsewhere.iterdir()) == []  # nothing written outside
    why = f"the engine's profiler folder cannot be used: {staging} is a symbolic link"
    traces = _lines(tmp_path / "out", event="trace", role="rollout")
    assert traces and {t["status"] for t in traces} == {"failed"}
    assert all(t["error"].startswith(why) for t in traces)
    closes = _lines(tmp_path / "out", event="close")
    assert len(closes) == len(traces) and {c["status"] for c in closes} == {"failed"}
    warned = [r for r in caplog.records if why in r.getMessage()]
    assert len(warned) == 1
    policy["roles"]["rollout"]["on_error"] = "raise"
    strict = apply_engine_policy(_llms(policy, 4, tensor_parallel_size=2), policy=policy)
    from policy_engine.errors import ProfilingError
    with pytest.raises(ProfilingError, match="profiler folder cannot be used"), \
            strict.training_step(2):
        pass


def test_an_engine_launched_with_another_folder_is_said_once_not_waited_for(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The engines write where they were launched to, not where the policy collects: one
    warning at the first start naming both folders, and no window waits files_timeout."""
    policy = _example(tmp_path)
    config = engine_args(load_policy(policy), "rollout")["profiler_config"]
    ours, other = config["torch_profiler_dir"], str(tmp_path / "elsewhere")
    llms = [fake_vllm.LLM(profiler_config={**config, "torch_profiler_dir": other},
                          tensor_parallel_size=2) for _ in range(4)]
    prof = apply_engine_policy(llms, role="rollout", policy=policy, files_timeout=30.0)
    waits: list[float] = []
    wait_for = engine_files.wait_for

    def spy(*args: Any, **kwargs: Any) -> Any:  # (folder, parser, wanted, timeout)
        waits.append(args[3] if len(args) > 3 else kwargs["timeout"])
        return wait_for(*args, **kwargs)

    monkeypatch.setattr(engine_files, "wait_for", spy)
    for step in (1, 2, 3):
        with prof.training_step(step):
            llms[0].generate(["x"])
    assert waits and set(waits) == {0.0}  # no window waited files_timeout for its files
    said = [r.getMessage() for r in caplog.records if "profiler folder" in r.getMessage()]
    assert len(said) == 1, said
    assert other in said[0] and ours in said[0]
    traces = _lines(tmp_path / "out", event="trace")
    assert traces and {t["status"] for t in traces} == {"failed"}
    assert all(other in t["error"] and ours in t["error"] for t in traces)
    assert os.listdir(other)  # the engine's files stay where it wrote them


def _steps_both_ways(tmp_path: Path, mode: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Steps 1-4 of the example, step 3 failing, then close: blocking or awaited."""
    policy = _example(tmp_path / mode)
    llms = _llms(policy, 4, tensor_parallel_size=2)
    prof = apply_engine_policy(llms, role="rollout", policy=policy)
    if mode == "sync":
        for step in (1, 2, 3, 4):
            with contextlib.suppress(KeyError), prof.training_step(step):
                if step == 3:
                    raise KeyError(step)
        prof.close()
    else:
        async def loop() -> None:
            for step in (1, 2, 3, 4):
                with contextlib.suppress(KeyError):
                    async with prof.atraining_step(step):
                        if step == 3:
                            raise KeyError(step)
            await prof.aclose()
        asyncio.run(loop())
    calls = [what for what, _ in llms[0].workers.calls]
    lines = _lines(tmp_path / mode / "out", role="rollout")
    return calls, sorted((r["event"], r["rank"], r.get("steps"), r.get("status"))
                         for r in lines if r["event"] in ("open", "trace"))


def test_blocking_and_awaited_steps_are_one_driver(tmp_path: Path) -> None:
    """training_step and atraining_step carry out the same decisions: the same calls at
    the same steps, the same manifest, a failed step's window partial."""
    sync = _steps_both_ways(tmp_path, "sync")
    assert sync == _steps_both_ways(tmp_path, "async")
    calls, lines = sync
    assert calls == ["start", "stop", "start", "stop"]
    assert [line for line in lines if line[0] == "trace"] == [
        ("trace", 0, [2], "complete"), ("trace", 0, [3], "partial"),
        ("trace", 1, [2], "complete"), ("trace", 1, [3], "partial")]
