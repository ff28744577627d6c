"""Keep the engine backends and the stand-in engines honest against vLLM's and SGLang's
real sources.

The wheels are downloaded (``pip download --no-deps``, never installed: both pull a CUDA
torch) once, and only the few ``.py`` files read here are kept, in
``$POLICY_ENGINE_CACHE/engines/<name>/<version>`` (else ``~/.cache/policy-engine``);
``$POLICY_ENGINE_WHEELS`` may name a folder that already holds the wheels. Read with
``ast``: the start/stop signatures, the fields of ``ProfilerConfig``,
``StartProfileRequest`` and ``ProfileReq``, the HTTP routes; the code that names the files
is run (its imports stubbed) and its names parsed back by the backends' parsers. The
stand-ins are compared with the same facts.
"""

from __future__ import annotations

import ast
import inspect
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import fields
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from fake_engines import server as fake_server
from fake_engines import sglang as fake_sglang
from fake_engines import vllm as fake_vllm

from policy_engine.backends.engine import files
from policy_engine.backends.sglang import checks as sglang_checks
from policy_engine.backends.vllm import checks as vllm_checks
from policy_engine.language.schema import build as schema

VLLM, SGLANG = ("vllm", "0.33.0"), ("sglang", "0.5.23")
VLLM_FILES = (
    "vllm/config/profiler.py", "vllm/entrypoints/llm.py", "vllm/v1/engine/async_llm.py",
    "vllm/entrypoints/serve/profile/api_router.py", "vllm/exceptions.py",
    "vllm/distributed/utils.py", "vllm/v1/worker/gpu_worker.py",
)  # fmt: skip
SGLANG_FILES = (
    "sglang/srt/entrypoints/engine.py", "sglang/srt/entrypoints/http_server.py",
    "sglang/srt/managers/io_struct.py", "sglang/srt/managers/tokenizer_control_mixin.py",
    "sglang/srt/managers/scheduler_components/profiler_manager.py",
)  # fmt: skip
POS, KW, VAR_KW = "positional-or-keyword", "keyword", "var-keyword"
START_PROFILE = [("self", POS), ("profile_prefix", POS), ("delay_iterations", KW),
                 ("max_iterations", KW), ("profiler_kwargs", KW)]


# -- getting the sources -----------------------------------------------------------------


def _cache() -> Path:
    base = os.environ.get("POLICY_ENGINE_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "policy-engine") / "engines"


def _wheel(name: str, version: str, tmp: str) -> Path:
    local = os.environ.get("POLICY_ENGINE_WHEELS")
    if local:
        found = sorted(Path(local).glob(f"{name}-{version}-*.whl"))
        if found:
            return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
           "--abi", "abi3", "--platform", "manylinux_2_34_x86_64",
           "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
           "--platform", "manylinux2014_x86_64", "--quiet", f"{name}=={version}", "-d", tmp]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        code, err = done.returncode, done.stderr
    except (OSError, subprocess.SubprocessError) as exc:
        code, err = 1, str(exc)
    wheels = sorted(Path(tmp).glob(f"{name}-*.whl"))
    if code or not wheels:
        reason = f"cannot download {name}=={version}: {err.strip()[-300:]}"
        print(reason, file=sys.stderr)
        pytest.skip(reason)
    return wheels[0]


def _sources(name: str, version: str, wanted: tuple[str, ...]) -> Path:
    """The wheel's ``wanted`` files in the cache (downloaded once; the folder only grows)."""
    dest = _cache() / name / version
    if all((dest / rel).is_file() for rel in wanted):
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _wheel(name, version, tmp)
        _cache().mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=_cache()))  # same file system: os.replace works
        with zipfile.ZipFile(wheel) as archive:
            for rel in wanted:
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(rel))
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(staging, dest)  # whole or nothing, for concurrent runs
    return dest


@pytest.fixture(scope="session")
def vllm_src() -> Path:
    return _sources(*VLLM, VLLM_FILES)


@pytest.fixture(scope="session")
def sglang_src() -> Path:
    return _sources(*SGLANG, SGLANG_FILES)


# -- reading them --------------------------------------------------------------------------


def _tree(root: Path, rel: str) -> ast.Module:
    return ast.parse((root / rel).read_text(), filename=rel)


def _node(root: Path, rel: str, qualname: str) -> Any:
    body: list[ast.stmt] = _tree(root, rel).body
    found: Any = None
    for part in qualname.split("."):
        found = next((n for n in body if isinstance(
            n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == part), None)
        assert found is not None, f"{rel}: no {qualname}"
        body = found.body
    return found


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[str, str]]:
    a = fn.args
    out = [(p.arg, POS) for p in a.posonlyargs + a.args] + [(p.arg, KW) for p in a.kwonlyargs]
    return out + ([(a.kwarg.arg, VAR_KW)] if a.kwarg else [])


def _fake_params(fn: Any) -> list[tuple[str, str]]:
    kinds = {inspect.Parameter.POSITIONAL_OR_KEYWORD: POS, inspect.Parameter.KEYWORD_ONLY: KW,
             inspect.Parameter.VAR_KEYWORD: VAR_KW}
    return [(p.name, kinds[p.kind]) for p in inspect.signature(fn).parameters.values()]


def _fields(cls: ast.ClassDef) -> dict[str, str]:
    """Annotated class-level fields -> their default, as source."""
    return {n.target.id: ast.unparse(n.value) if n.value is not None else ""
            for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _decorators(root: Path, rel: str) -> dict[str, list[str]]:
    return {n.name: [ast.unparse(d) for d in n.decorator_list] for n in ast.walk(_tree(root, rel))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _function(root: Path, rel: str, qualname: str, namespace: dict[str, Any]) -> Any:
    """The real function, compiled alone in ``namespace`` (annotations dropped)."""
    node = _node(root, rel, qualname)
    node.decorator_list, node.returns = [], None
    for arg in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]:
        arg.annotation = None
    module = ast.Module(body=[node], type_ignores=[])
    exec(compile(ast.fix_missing_locations(module), rel, "exec"), namespace)
    return namespace[node.name]


# -- vLLM -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("rel", "qualname", "is_async", "fake"), [
    ("vllm/entrypoints/llm.py", "LLM", False, fake_vllm.LLM),
    ("vllm/v1/engine/async_llm.py", "AsyncLLM", True, fake_vllm.AsyncLLM),
])
def test_vllm_start_stop_signatures(vllm_src: Path, rel: str, qualname: str, is_async: bool,
                                    fake: Any) -> None:
    start = _node(vllm_src, rel, f"{qualname}.start_profile")
    stop = _node(vllm_src, rel, f"{qualname}.stop_profile")
    assert _params(start) == START_PROFILE and _params(stop) == [("self", POS)]
    assert isinstance(start, ast.AsyncFunctionDef) is is_async
    assert isinstance(stop, ast.AsyncFunctionDef) is is_async
    # Where the driver reads the launch configuration: LLM.llm_engine, AsyncLLM.vllm_config.
    init = ast.unparse(_node(vllm_src, rel, f"{qualname}.__init__"))
    holder = "self.vllm_config = vllm_config" if is_async else "self.llm_engine = "
    assert holder in init
    assert _fake_params(fake.start_profile) == START_PROFILE
    assert _fake_params(fake.stop_profile) == [("self", POS)]
    assert inspect.iscoroutinefunction(fake.start_profile) is is_async


def test_vllm_profiler_config_fields(vllm_src: Path) -> None:
    real = _fields(_node(vllm_src, "vllm/config/profiler.py", "ProfilerConfig"))
    settings = {k: v["default"] for k, v in vllm_checks.SETTINGS["properties"].items()}
    launch = vllm_checks.launch_config(
        dict(settings, torch_profiler_activities=["CPU"]),
        SimpleNamespace(wait=1, warmup=1, active=1), "/abs")
    assert set(launch) <= set(real), set(launch) - set(real)
    # Per-session bounds exist in the config too (their launch defaults).
    assert {"delay_iterations", "max_iterations"} <= set(real)
    # The defaults the settings' descriptions call vLLM's.
    assert real["torch_profiler_with_stack"] == "True"
    assert real["torch_profiler_dump_cuda_time_total"] == "True"
    assert real["ignore_frontend"] == "False"
    activities = ast.unparse(_node(vllm_src, "vllm/config/profiler.py", "ProfilerConfig"))
    assert "must be set when profiler is 'torch'" in activities
    literal = next(n for n in _tree(vllm_src, "vllm/config/profiler.py").body
                   if isinstance(n, ast.Assign) and ast.unparse(n.targets[0])
                   == "TorchProfilerActivity")
    assert set(vllm_checks.ACTIVITIES) <= set(ast.literal_eval(literal.value.slice))


def test_vllm_routes_request_and_conflict(vllm_src: Path) -> None:
    rel = "vllm/entrypoints/serve/profile/api_router.py"
    routes = _decorators(vllm_src, rel)
    assert routes["start_profile"] == ["router.post('/start_profile')"]
    assert routes["stop_profile"] == ["router.post('/stop_profile')"]
    request = _fields(_node(vllm_src, rel, "StartProfileRequest"))
    assert tuple(request) == fake_server.VLLM_START_FIELDS
    assert set(vllm_checks.start_kwargs({"profiler_kwargs": {"a": 1}},
                                        SimpleNamespace(skip_first=1, active=2), "p")) \
        <= set(request)
    attach = ast.unparse(_node(vllm_src, rel, "attach_router"))
    assert "profiler_config.profiler is not None" in attach and "include_router(router)" in attach
    conflict = ast.unparse(_node(vllm_src, "vllm/exceptions.py", "ProfilerAlreadyActiveError"))
    assert "HTTPStatus.CONFLICT" in conflict
    assert fake_vllm.ProfilerAlreadyActiveError.http_status == 409


def _vllm_suffix(vllm_src: Path, **ranks: int) -> str:
    groups = {f"get_{k}_group": (lambda v=v: SimpleNamespace(rank_in_group=v))
              for k, v in ranks.items() if k != "rank"}
    state = ModuleType("vllm.distributed.parallel_state")
    state.__dict__.update(groups)
    stubs = {"vllm": ModuleType("vllm"), "vllm.distributed": ModuleType("vllm.distributed"),
             "vllm.distributed.parallel_state": state}
    fn = _function(vllm_src, "vllm/distributed/utils.py", "get_worker_rank_suffix", {})
    with mock.patch.dict(sys.modules, stubs):
        return str(fn(global_rank=ranks["rank"]))


def test_vllm_file_names_parse_back(vllm_src: Path, tmp_path: Path) -> None:
    import torch.profiler
    worker = _node(vllm_src, "vllm/v1/worker/gpu_worker.py", "Worker.profile")
    assert "trace_name = f'{profile_prefix}_{rank_suffix}'" in ast.unparse(worker)
    suffix = _vllm_suffix(vllm_src, dp=1, pp=2, tp=3, dcp=0, ep=7, rank=13)
    prefix = files.capture_prefix("rollout", 2, 1, "ab12")
    # torch's own handler names the file, as in vLLM's TorchProfilerWrapper.
    handler = torch.profiler.tensorboard_trace_handler(str(tmp_path), worker_name=f"{prefix}_"
                                                       f"{suffix}", use_gzip=True)
    handler(SimpleNamespace(export_chrome_trace=lambda p, **kw: Path(p).write_text("{}")))
    (name,) = os.listdir(tmp_path)
    found = files.parse_vllm(name, prefix)
    assert found is not None and found.coords == {"dp": 1, "pp": 2, "tp": 3, "dcp": 0,
                                                  "ep": 7, "rank": 13}
    front = ast.unparse(_node(vllm_src, "vllm/v1/engine/async_llm.py", "AsyncLLM"))
    assert "f'{socket.gethostname()}_{os.getpid()}.async_llm'" in front
    assert "worker_name = f'{profile_prefix}_{worker_name}'" in front


def test_vllm_prefix_rule(vllm_src: Path) -> None:
    check = _function(vllm_src, "vllm/config/profiler.py", "validate_profile_prefix", {})
    for sample in [files.capture_prefix("roll_out/x", 7, 3, "ffff"),
                   files.capture_prefix("-", None, 0, ""), files.capture_prefix("r" * 300, 1, 0,
                                                                                "t")]:
        assert check(sample) == sample
    for bad in ["_x", "a b", "", "a" * 129]:
        with pytest.raises(ValueError):
            check(bad)
        with pytest.raises(ValueError):
            fake_vllm.validate_profile_prefix(bad)


def test_fake_vllm_names_equal_the_real_ones(vllm_src: Path, tmp_path: Path) -> None:
    llm = fake_vllm.LLM(profiler_config={"profiler": "torch", "torch_profiler_dir": str(tmp_path)},
                        tensor_parallel_size=2, pipeline_parallel_size=2, data_parallel_size=2)
    llm.start_profile("pfx")
    llm.stop_profile()
    names = os.listdir(tmp_path)
    assert len(names) == 8
    for name in names:
        found = files.parse_vllm(name, "pfx")
        assert found is not None
        real = _vllm_suffix(vllm_src, **found.coords)
        assert name.startswith(f"pfx_{real}.")


# -- SGLang -----------------------------------------------------------------------------------


def test_sglang_start_stop_signatures(sglang_src: Path) -> None:
    rel = "sglang/srt/entrypoints/engine.py"
    start = _node(sglang_src, rel, "Engine.start_profile")
    stop = _node(sglang_src, rel, "Engine.stop_profile")
    assert _params(start) == [("self", POS), ("kwargs", VAR_KW)]
    assert _params(stop) == [("self", POS)]
    # A blocking call on the engine's own loop: never from inside that loop.
    assert "self.loop.run_until_complete" in ast.unparse(start)
    assert _fake_params(fake_sglang.Engine.start_profile) == _params(start)
    assert _fake_params(fake_sglang.Engine.stop_profile) == _params(stop)


def test_sglang_profile_req_fields(sglang_src: Path) -> None:
    rel = "sglang/srt/managers/io_struct.py"
    real = {**_fields(_node(sglang_src, rel, "BaseReq")),
            **_fields(_node(sglang_src, rel, "ProfileReq"))}
    assert set(real) == {f.name for f in fields(fake_sglang.ProfileReq)}
    sent = sglang_checks.start_kwargs(
        {k: v["default"] for k, v in sglang_checks.SETTINGS["properties"].items()}
        | {"profile_stages": ["x"]}, SimpleNamespace(active=3), "/abs", "p", "id")
    assert set(sent) <= set(real), set(sent) - set(real)
    assert real["with_stack"] == real["record_shapes"] == "None"  # the tokenizer decides
    mixin = ast.unparse(_node(sglang_src, "sglang/srt/managers/tokenizer_control_mixin.py",
                              "TokenizerControlMixin.start_profile"))
    assert "req.profile_id = req.profile_id or str(time.time())" in mixin
    for env in sglang_checks.launch_env({"with_stack": True, "record_shapes": True}, "/x"):
        if env != "SGLANG_TORCH_PROFILER_DIR":
            assert f"'{env}'" in mixin
    manager = ast.unparse(_node(
        sglang_src, "sglang/srt/managers/scheduler_components/profiler_manager.py",
        "SchedulerProfilerManager._init_profile"))
    assert "os.getenv('SGLANG_TORCH_PROFILER_DIR', '/tmp')" in manager
    assert "activities = ['CPU', 'GPU']" in manager


def test_sglang_routes(sglang_src: Path) -> None:
    routes = _decorators(sglang_src, "sglang/srt/entrypoints/http_server.py")
    for name, path in (("start_profile_async", "/start_profile"),
                       ("stop_profile_async", "/stop_profile")):
        assert f"app.api_route('{path}', methods=['GET', 'POST'])" in routes[name]


def _sglang_names(sglang_src: Path, tmp_path: Path, *, tp: int, dp: int, pp: int, ep: int,
                  sizes: tuple[int, int, int], stage: str | None,
                  activities: list[str]) -> list[str]:
    """Run SGLang's own _stop_profile (its imports stubbed) and return the paths it wrote."""
    written: list[str] = []
    parallel = SimpleNamespace(tp_rank=tp, dp_rank=dp, pp_rank=pp, moe_ep_rank=ep,
                               num_dp_ranks=sizes[0], pp_size=sizes[1], moe_ep_size=sizes[2])
    torch_stub = SimpleNamespace(
        distributed=SimpleNamespace(barrier=lambda *a: None),
        cuda=SimpleNamespace(memory=SimpleNamespace(
            _dump_snapshot=written.append, _record_memory_history=lambda **k: None)))
    namespace = {"envs": SimpleNamespace(SGLANG_PROFILE_V2=SimpleNamespace(get=lambda: False)),
                 "logger": logging.getLogger("sglang-stand-in"), "os": os, "time": __import__(
                     "time"), "gc": __import__("gc"), "torch": torch_stub, "_is_npu": False,
                 "get_parallel": lambda: parallel, "ProfileReqOutput": lambda **k: k}
    stop = _function(sglang_src,
                     "sglang/srt/managers/scheduler_components/profiler_manager.py",
                     "SchedulerProfilerManager._stop_profile", namespace)
    me = SimpleNamespace(
        profile_in_progress=True, torch_profiler_output_dir=tmp_path, profile_prefix="pfx",
        profile_id="1733100000.5", rpd_profiler=None, profiler_activities=activities,
        torch_profiler=SimpleNamespace(stop=lambda: None, export_chrome_trace=written.append),
        _merge_profile_traces=lambda: "", _apply_detailed_annotations=lambda on: None,
        profiler_start_forward_ct=None, dp_tp_cpu_group=None)
    stop(me, SimpleNamespace(name=stage) if stage else None)
    return [os.path.basename(p) for p in written]


@pytest.mark.parametrize(("ranks", "sizes", "stage"), [
    ({"tp": 1, "dp": 0, "pp": 0, "ep": 0}, (1, 1, 1), None),
    ({"tp": 3, "dp": 1, "pp": 1, "ep": 2}, (2, 2, 4), "DECODE"),
    ({"tp": 0, "dp": 1, "pp": 0, "ep": 0}, (2, 1, 1), "EXTEND"),
])
def test_sglang_file_names_parse_back(sglang_src: Path, tmp_path: Path, ranks: dict[str, int],
                                      sizes: tuple[int, int, int], stage: str | None) -> None:
    names = _sglang_names(sglang_src, tmp_path, sizes=sizes, stage=stage,
                          activities=["CPU", "GPU", "MEM"], **ranks)
    trace, memory = names
    found = files.parse_sglang(trace, "pfx", "1733100000.5")
    assert found is not None and found.kind == "trace"
    expected = {"tp": ranks["tp"]}
    for dim, size in zip(("dp", "pp", "ep"), sizes, strict=True):
        if size > 1:
            expected[dim] = ranks[dim]
    assert found.coords == expected
    assert found.stage == (stage.lower() if stage else None)
    snap = files.parse_sglang(memory, "pfx", "1733100000.5")
    assert snap is not None and snap.kind == "memory" and snap.coords == {"tp": ranks["tp"]}


def test_fake_sglang_names_equal_the_real_ones(sglang_src: Path, tmp_path: Path) -> None:
    engine = fake_sglang.Engine(tp_size=2, dp_size=2, pp_size=2)
    out = tmp_path / "fake"
    engine.start_profile(output_dir=str(out), profile_prefix="pfx", profile_id="1733100000.5",
                         profile_by_stage=True)
    engine.stop_profile()
    fake = sorted(os.listdir(out))
    real = sorted(
        name for tp in range(2) for dp in range(2) for pp in range(2)
        for stage in ("EXTEND", "DECODE")
        for name in _sglang_names(sglang_src, tmp_path, tp=tp, dp=dp, pp=pp, ep=0,
                                  sizes=(2, 2, 1), stage=stage, activities=["CPU", "GPU"]))
    assert fake == real
    engine.shutdown()


def test_settings_are_in_the_schema() -> None:
    role = schema.defaults("role")
    assert set(role["vllm"]) == set(vllm_checks.SETTINGS["properties"])
    assert set(role["sglang"]) == set(sglang_checks.SETTINGS["properties"])
    for block in (vllm_checks.SETTINGS, sglang_checks.SETTINGS):
        assert all(v.get("description") for v in block["properties"].values())
