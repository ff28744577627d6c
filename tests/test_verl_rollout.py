"""verl's vLLM rollout servers under the policy.

verl's ``vLLMHttpServer`` cannot be imported here (it needs vLLM and a GPU). What the plugin
relies on is read from the installed verl's source instead: the class, the methods it
patches and the attributes it reads. The server is then played by a class of the same
shape around the project's stand-in ``AsyncLLM`` (tests/fake_engines/vllm.py, checked
against vLLM's wheel by tests/test_engines_contract.py), launched the way verl launches it:
with what ``build_vllm_profiler_args`` returns when ``_should_profile()`` holds.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import json
import types
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_engines import vllm as fake_vllm

from policy_engine.analysis.manifests import scan_manifests
from policy_engine.integrations.verl import (
    PATCHES,
    PROFILE_MODULE,
    SGLANG_SERVER,
    VLLM_SERVER,
)
from policy_engine.integrations.verl import rollout as verl_rollout
from policy_engine.language.load import ENV_FILE
from policy_engine.runtime.process import state

SERVER = VLLM_SERVER


def _server_source() -> ast.Module:
    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        pytest.skip("verl is not installed (scripts/install_verl.sh)")
    path = Path(spec.origin).parent / "workers" / "rollout" / "vllm_rollout" \
        / "vllm_async_server.py"
    return ast.parse(path.read_text(encoding="utf-8"))


def test_verl_server_has_what_the_plugin_patches() -> None:
    tree = _server_source()
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == "verl.utils.profiler" for alias in node.names}
    assert "build_vllm_profiler_args" in imported
    server = next(node for node in tree.body
                  if isinstance(node, ast.ClassDef) and node.name == "vLLMHttpServer")
    methods = {node.name: node for node in server.body
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert isinstance(methods["start_profile"], ast.AsyncFunctionDef)
    assert methods["start_profile"].args.kwarg is not None
    assert isinstance(methods["stop_profile"], ast.AsyncFunctionDef)
    assert [a.arg for a in methods["stop_profile"].args.args] == ["self"]
    assert [a.arg for a in methods["_should_profile"].args.args] == ["self"]
    assigned = {target.attr for node in ast.walk(server) if isinstance(node, ast.Assign)
                for target in node.targets if isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name) and target.value.id == "self"}
    assert {"replica_rank", "node_rank", "engine", "global_steps"} <= assigned
    # The engine is launched with the profiler arguments only where _should_profile holds,
    # and start_profile reaches the engine only there too.
    calls = [node for node in ast.walk(server) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id == "build_vllm_profiler_args"]
    assert calls
    start = ast.unparse(methods["start_profile"])
    assert "self._should_profile()" in start and "self.engine.start_profile" in start


def test_the_plugin_waits_for_the_server_module() -> None:
    assert PATCHES[SERVER] == ("rollout", "patch_vllm_server")


def test_each_module_the_plugin_waits_for_is_named_once_and_patched() -> None:
    # The names live beside the table that waits for them; rollout.py spells none again.
    assert set(PATCHES) == {PROFILE_MODULE, VLLM_SERVER, SGLANG_SERVER}
    assert PATCHES[SGLANG_SERVER] == ("rollout", "patch_sglang_server")
    for module, function in PATCHES.values():
        assert callable(getattr(importlib.import_module(
            f"policy_engine.integrations.verl.{module}"), function))
    assert not {"VLLM_SERVER", "SGLANG_SERVER"} & set(vars(verl_rollout))


class _Server:
    """verl's vLLMHttpServer, reduced to what profiling touches (its method bodies do what
    verl 0.9.1's do: the launch asks _should_profile, then build_vllm_profiler_args)."""

    module: Any = None

    def __init__(self, replica_rank: int, node_rank: int = 0) -> None:
        self.replica_rank = replica_rank
        self.node_rank = node_rank
        self.global_steps: int | None = None
        self.verl_calls: list[str] = []
        args: dict[str, Any] = {}
        if self._should_profile():
            args.update(self.module.build_vllm_profiler_args(None, None, replica_rank,
                                                             legacy_env=False))
        config = json.loads(args["profiler_config"]) if "profiler_config" in args else None
        self.engine = fake_vllm.AsyncLLM(profiler_config=config, tensor_parallel_size=2)

    def _should_profile(self) -> bool:
        return False  # verl's own rollout profiler block: off

    async def start_profile(self, **kwargs: Any) -> None:
        self.verl_calls.append("start")
        if self.node_rank != 0:
            return
        if self._should_profile():
            await self.engine.start_profile(**kwargs)

    async def stop_profile(self) -> None:
        self.verl_calls.append("stop")
        if self.node_rank != 0:
            return
        if self._should_profile():
            await self.engine.stop_profile()

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps


def _verl_build(*args: Any, **kwargs: Any) -> dict[str, Any]:
    raise AssertionError("verl's own profiler arguments are not asked for under a policy")


def _module() -> types.ModuleType:
    module = types.ModuleType(SERVER)
    server = type("vLLMHttpServer", (_Server,), {"module": module})
    module.vLLMHttpServer = server  # type: ignore[attr-defined]
    module.build_vllm_profiler_args = _verl_build  # type: ignore[attr-defined]
    return module


POLICY = {
    "version": 1, "prefix": "grpo",
    "defaults": {"enabled": False, "steps": [2, 3]},
    "roles": {"rollout": {"enabled": True, "backend": "vllm", "mesh": {"dp": 2, "tp": 2},
                          "ranks": {"dp": 1}}},
}


@pytest.fixture
def policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "profile_policy.yaml"
    path.write_text(yaml.safe_dump({**POLICY, "output_dir": str(tmp_path / "out")}))
    monkeypatch.setenv(ENV_FILE, str(path))
    yield path
    state.reset()


async def _trainer(servers: list[Any], steps: int) -> None:
    """verl's ray_trainer: the weights of step 0 before the loop, then per step the
    rollout between start_profile and stop_profile, then the new weights."""
    for server in servers:
        await server.set_global_steps(0)
    for step in range(1, steps + 1):
        await asyncio.gather(*(s.start_profile() for s in servers))
        for server in servers:
            workers = getattr(server.engine, "workers", None)
            if workers is not None and workers.config:
                await server.engine.generate("prompt")
        await asyncio.gather(*(s.stop_profile() for s in servers))
        for server in servers:
            await server.set_global_steps(step)


def test_the_policy_drives_the_selected_replicas_engine(policy: Path, tmp_path: Path) -> None:
    module = _module()
    verl_rollout.patch_vllm_server(module)
    servers = [module.vLLMHttpServer(replica) for replica in (0, 1)]
    # Launched with the policy's profiler configuration on the selected replica only.
    assert servers[0].engine.workers.config == {}
    launched = servers[1].engine.workers.config
    assert launched["torch_profiler_dir"].startswith(str(tmp_path / "out"))
    asyncio.run(_trainer(servers, steps=4))
    traces = [r for r in scan_manifests(str(tmp_path / "out")).records
              if r.get("event") == "trace"]
    assert sorted((t["steps"], t["rank"]) for t in traces) == \
        [([2], 2), ([2], 3), ([3], 2), ([3], 3)]
    assert {t["status"] for t in traces} == {"complete"}
    for t in traces:  # the engine's files, filed in the per-window layout
        assert t["path"].startswith(f"rollout/step{t['steps'][0]}/grpo_rank{t['rank']}-of-4_")
        assert (tmp_path / "out" / t["path"]).is_file()


def test_a_step_verl_passes_wins_over_the_weights_version(policy: Path, tmp_path: Path) -> None:
    module = _module()
    verl_rollout.patch_vllm_server(module)
    server = module.vLLMHttpServer(1)

    async def run() -> None:
        await server.set_global_steps(40)  # verl's separation trainer passes global_step
        await server.start_profile(global_step=3)
        await server.engine.generate("prompt")
        await server.stop_profile()
    asyncio.run(run())
    traces = [r for r in scan_manifests(str(tmp_path / "out")).records
              if r.get("event") == "trace"]
    assert {tuple(t["steps"]) for t in traces} == {(3,)}


def test_without_a_policy_verl_profiles_as_it_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_FILE, raising=False)
    module = _module()
    module.build_vllm_profiler_args = lambda *a, **k: {}  # type: ignore[attr-defined]
    verl_rollout.patch_vllm_server(module)
    server = module.vLLMHttpServer(0)
    asyncio.run(server.start_profile(profile_prefix="x"))
    asyncio.run(server.stop_profile())
    assert server.verl_calls == ["start", "stop"]
    assert server.engine.workers.calls == []  # verl's block is off: the engine untouched


def test_a_rollout_role_on_another_backend_leaves_the_engine_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "output_dir": str(tmp_path / "out"),
                                    "roles": {"rollout": {"enabled": True, "steps": [1]}}}))
    monkeypatch.setenv(ENV_FILE, str(path))
    module = _module()
    verl_rollout.patch_vllm_server(module)
    server = module.vLLMHttpServer(0)
    asyncio.run(_trainer([server], steps=2))
    assert server.engine.workers.config == {} and server.engine.workers.calls == []
    assert server.verl_calls == []  # verl's own start/stop bodies do not run under a policy
    state.reset()


def test_an_engine_that_cannot_be_profiled_never_stops_the_rollout(
        policy: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    module = _module()
    verl_rollout.patch_vllm_server(module)
    server = module.vLLMHttpServer(1)
    server.engine = object()  # no profiler methods at all
    with caplog.at_level("WARNING", logger="policy_engine"):
        asyncio.run(_trainer([server], steps=3))
    assert caplog.text.count("cannot be profiled") == 1
    assert ("policy-engine: verl's vLLM server of replica 1 cannot be profiled: role 'rollout': "
            "TypeError: object has no start_profile/stop_profile") in caplog.text
    assert [r.levelname for r in caplog.records] == ["ERROR"]


@pytest.mark.parametrize(("roles", "text", "said"), [
    # A malformed PROFILE_POLICY_VERL_ROLES: the replica's role cannot be told.
    ("rollout", yaml.safe_dump(POLICY),
     "cannot be profiled: PROFILE_POLICY_VERL_ROLES item 1 'rollout' is not VERL_NAME=ROLE"),
    # A policy that does not load: verl's own rollout profiler block does not apply either.
    ("", "version: 1\nroles: {rollout: {enabled: maybe}}\n",
     "cannot be profiled: the policy PROFILE_POLICY="),
])
def test_a_plugin_failure_leaves_every_engine_unprofiled_with_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        roles: str, text: str, said: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    monkeypatch.setenv(ENV_FILE, str(path))
    monkeypatch.setenv("PROFILE_POLICY_VERL_ROLES", roles)
    module = _module()
    verl_rollout.patch_vllm_server(module)
    with caplog.at_level("WARNING", logger="policy_engine"):
        servers = [module.vLLMHttpServer(replica) for replica in (0, 1)]
        asyncio.run(_trainer(servers, steps=3))
    for server in servers:
        assert server.engine.workers.config == {} and server.engine.workers.calls == []
        assert server.verl_calls == []  # verl's own start/stop bodies do not run either
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    assert caplog.records[0].getMessage().startswith(
        f"policy-engine: verl's vLLM server of replica 0 {said}")
    state.reset()
