"""The driver against engine servers: a real HTTP server on 127.0.0.1 serving the engines'
profiler routes (tests/fake_engines/server.py), writing files as the engines do."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from fake_engines import sglang as fake_sglang
from fake_engines import vllm as fake_vllm
from fake_engines.server import serving

from policy_engine.analysis.manifests import scan_manifests
from policy_engine.cli.engine_args import build as engine_args
from policy_engine.integrations.engines import apply_engine_policy
from policy_engine.language.load import load_policy


def _policy(tmp_path: Path, backend: str, **rollout: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"enabled": True, "backend": backend, "mesh": {"dp": 2, "tp": 2},
                            "ranks": "all", "steps": [2, 3]}
    body.update(rollout)
    return {"version": 1, "prefix": "srv", "output_dir": str(tmp_path / "out"),
            "roles": {"rollout": body}}


def _traces(tmp_path: Path) -> list[dict[str, Any]]:
    return [r for r in scan_manifests(str(tmp_path / "out")).records if r["event"] == "trace"]


def _vllm_engines(policy: dict[str, Any], count: int) -> list[fake_vllm.AsyncLLM]:
    config = engine_args(load_policy(policy), "rollout")["profiler_config"]
    return [fake_vllm.AsyncLLM(profiler_config=config, tensor_parallel_size=2)
            for _ in range(count)]


def test_vllm_servers_one_per_replica(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "vllm", schedule={"skip_first": 3, "active": 5, "repeat": 1})
    first, second = _vllm_engines(policy, 2)
    with serving("vllm", first) as (url0, server0), serving("vllm", second) as (url1, _):
        prof = apply_engine_policy([url0, url1], policy=policy)
        for step in (1, 2, 3, 4):
            with prof.training_step(step):
                pass
    starts = [body for _, route, body in server0.requests if route == "/start_profile"]
    assert len(starts) == 2
    assert starts[0]["delay_iterations"] == 3 and starts[0]["max_iterations"] == 5
    assert starts[0]["profile_prefix"].startswith("pe-rollout-step2-dp0-")
    traces = _traces(tmp_path)
    assert sorted((t["rank"], t["steps"][0]) for t in traces) == [
        (r, s) for r in range(4) for s in (2, 3)]
    assert {t["status"] for t in traces} == {"complete"}
    # Each server names its own engine dp0; the replica gives the policy's dp.
    assert {(t["coords"]["dp"], t["extra"]["engine"]["dp"]) for t in traces} == {(0, 0), (1, 0)}


def test_vllm_server_without_profiler_answers_404(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "vllm", mesh={"tp": 2})
    engine = fake_vllm.AsyncLLM(tensor_parallel_size=2)  # launched without --profiler-config
    with serving("vllm", engine) as (url, _), \
            apply_engine_policy(url, policy=policy).training_step(2):
        pass
    traces = _traces(tmp_path)
    assert {t["status"] for t in traces} == {"failed"}
    assert "404" in traces[0]["error"] and "engine-args" in traces[0]["error"]


def test_vllm_server_busy_answers_409(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "vllm", mesh={"tp": 2})
    engine = _vllm_engines(policy, 1)[0]
    with serving("vllm", engine) as (url, _):
        # Someone else's session is running on the server.
        request = urllib.request.Request(url + "/start_profile", data=b"{}", method="POST",
                                         headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=30).read()
        with apply_engine_policy(url, policy=policy).training_step(2):
            pass
    traces = _traces(tmp_path)
    assert {t["status"] for t in traces} == {"failed"}
    assert "409" in traces[0]["error"] and "already active" in traces[0]["error"]


def test_sglang_server_async_driver(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "sglang", ranks={"dp": 1},
                     sglang={"with_stack": False, "record_shapes": True})
    engines = [fake_sglang.Engine(tp_size=2) for _ in range(2)]
    with serving("sglang", engines[0]) as (url0, server0), \
            serving("sglang", engines[1]) as (url1, server1):
        prof = apply_engine_policy([url0, url1], policy=policy)

        async def loop() -> None:
            for step in (1, 2):
                async with prof.atraining_step(step):
                    await asyncio.sleep(0)
        asyncio.run(loop())
    assert not server0.requests  # replica 0 is not selected
    start = server1.requests[0][2]
    assert start["with_stack"] is False and start["record_shapes"] is True
    assert start["output_dir"].startswith("/") and start["merge_profiles"] is False
    assert start["profile_prefix"].startswith("pe-rollout-step2-dp1-")
    traces = _traces(tmp_path)
    assert sorted(t["rank"] for t in traces) == [2, 3]
    assert {t["status"] for t in traces} == {"complete"}
    assert all(t["path"].startswith("rollout/step2/") for t in traces)
    for engine in engines:
        engine.shutdown()


def test_sglang_routes_take_get_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a request naming no folder writes where SGLang's variable says (else /tmp, as SGLang)
    monkeypatch.setenv("SGLANG_TORCH_PROFILER_DIR", str(tmp_path))
    engine = fake_sglang.Engine(tp_size=1)
    with serving("sglang", engine) as (url, _):
        for route in ("/start_profile", "/stop_profile"):
            with urllib.request.urlopen(url + route, timeout=30) as answer:
                assert answer.status == 200
    assert json.dumps(engine.schedulers.requests[0].activities) == '["CPU", "GPU"]'
    assert [p.name.endswith("-TP-0.trace.json.gz") for p in tmp_path.iterdir()] == [True]
    engine.shutdown()


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://host"])
def test_a_server_is_a_url(tmp_path: Path, url: str) -> None:
    with pytest.raises(TypeError, match="URL"):
        apply_engine_policy(url, policy=_policy(tmp_path, "vllm", mesh={"tp": 2}))
