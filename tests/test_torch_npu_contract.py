"""Keep the fake torch_npu honest against the real wheel's Python sources.

The real wheel is downloaded (``pip download --no-deps``, never installed: without Ascend
CANN it breaks ``import torch``) into ``$POLICY_ENGINE_CACHE/torch_npu/<version>`` or
``~/.cache/policy-engine/torch_npu/<version>``, and only the few ``.py`` files read here are
kept. Nothing of it enters the repository. Every class, function, keyword and constant that
the backend or the fake uses is listed below and looked up in those sources with ``ast``;
the fake is then compared with the same list by introspection. The real
``profiler/scheduler.py`` is also loaded (its parent packages stubbed) and must give
``torch.profiler.schedule``'s actions.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from npu_fixtures import installed_fake

from policy_engine.backends.mstx import session as backend
from policy_engine.language.schema import build as schema
from policy_engine.settings import mstx as checks

VERSION, OLD = "2.13.0", "2.5.1"
FILES = (
    "version.py",
    "npu/__init__.py",
    "npu/mstx.py",
    "profiler/__init__.py",
    "profiler/profiler.py",
    "profiler/experimental_config.py",
    "profiler/scheduler.py",
    "profiler/_profiler_path_creator.py",
    "profiler/_profiler_action_controller.py",
    "profiler/analysis/prof_common_func/_constant.py",
)
KW, POS = "keyword", "positional-or-keyword"

# What the backend and the fake call, by keyword: (file, "Class.method" or "function") ->
# the parameters in order, with how each may be passed.
SIGNATURES_213: dict[tuple[str, str], list[tuple[str, str]]] = {
    ("profiler/profiler.py", "profile.__init__"): [
        (name, KW)
        for name in (
            "activities", "schedule", "on_trace_ready", "record_shapes", "profile_memory",
            "with_stack", "with_flops", "with_modules", "experimental_config",
            "execution_trace_observer", "custom_trace_id_callback", "use_cuda",
        )
    ],
    ("profiler/profiler.py", "tensorboard_trace_handler"): [
        ("dir_name", POS), ("worker_name", POS), ("analyse_flag", POS), ("async_mode", POS),
    ],
    ("profiler/profiler.py", "analyse"): [
        ("profiler_path", POS), ("max_process_number", POS), ("export_type", POS),
    ],
    ("profiler/profiler.py", "_KinetoProfile.add_metadata_json"): [("key", POS), ("value", POS)],
    ("profiler/profiler.py", "profile.start"): [],
    ("profiler/profiler.py", "profile.step"): [],
    ("profiler/profiler.py", "profile.stop"): [],
    ("profiler/experimental_config.py", "_ExperimentalConfig.__init__"): [
        (name, POS)
        for name in (
            "profiler_level", "aic_metrics", "l2_cache", "msprof_tx", "mstx",
            "data_simplification", "record_op_args", "op_attr", "gc_detect_threshold",
            "export_type", "host_sys", "mstx_domain_include", "mstx_domain_exclude", "sys_io",
            "sys_interconnection",
        )
    ],
    ("profiler/scheduler.py", "Schedule.__init__"): [
        (name, POS)
        for name in ("wait", "active", "warmup", "repeat", "skip_first", "skip_first_wait")
    ],
    ("npu/mstx.py", "mstx.range_start"): [("message", POS), ("stream", POS), ("domain", POS)],
    ("npu/mstx.py", "mstx.range_end"): [("range_id", POS), ("domain", POS)],
    ("npu/mstx.py", "mstx.mark"): [("message", POS), ("stream", POS), ("domain", POS)],
}  # fmt: skip
# 2.5.1: what the fake's use_version("2.5.1") must reproduce.
SIGNATURES_251: dict[tuple[str, str], list[tuple[str, str]]] = {
    ("profiler/experimental_config.py", "_ExperimentalConfig.__init__"): [
        (name, POS)
        for name in (
            "profiler_level", "aic_metrics", "l2_cache", "msprof_tx", "data_simplification",
            "record_op_args", "op_attr", "gc_detect_threshold", "export_type",
        )
    ],
    ("npu/mstx.py", "mstx.range_start"): [("message", POS), ("stream", POS)],
    ("npu/mstx.py", "mstx.range_end"): [("range_id", POS)],
    ("npu/mstx.py", "mstx.mark"): [("message", POS)],
}  # fmt: skip
# Class -> the attributes used; each names a constant of torch_npu's Constant class.
ATTRIBUTES = {
    ("profiler/experimental_config.py", "ProfilerLevel"): set(backend.LEVELS.values()),
    ("profiler/experimental_config.py", "AiCMetrics"): set(backend.AIC_METRICS.values()),
    ("profiler/experimental_config.py", "ExportType"): set(backend.EXPORT_TYPES.values()),
    ("profiler/experimental_config.py", "HostSystem"): {"CPU", "MEM", "DISK", "NETWORK", "OSRT",
                                                        "NUMA"},
    ("profiler/scheduler.py", "ProfilerAction"): {"NONE", "WARMUP", "RECORD", "RECORD_AND_SAVE"},
}  # fmt: skip
EXPORTS = {
    "profiler/__init__.py": {
        "profile", "tensorboard_trace_handler", "schedule", "ProfilerAction", "ProfilerActivity",
        "_ExperimentalConfig", "ProfilerLevel", "AiCMetrics", "ExportType", "HostSystem",
    },
    "npu/__init__.py": {"mstx"},
}  # fmt: skip
# What the backend reads back from an _ExperimentalConfig (see MstxSession._readback).
READBACK = {
    "_profiler_level", "_aic_metrics", "_l2_cache", "_msprof_tx", "_mstx", "_data_simplification",
    "record_op_args", "_export_type", "_mstx_domain_include", "_mstx_domain_exclude",
}  # fmt: skip


# -- getting the sources -----------------------------------------------------------------


def _cache() -> Path:
    base = os.environ.get("POLICY_ENGINE_CACHE")
    root = Path(base) if base else Path.home() / ".cache" / "policy-engine"
    return root / "torch_npu"


def _download(version: str, files: tuple[str, ...] = FILES, derived: tuple[str, ...] = (),
              derive: Callable[[zipfile.ZipFile, Path], None] | None = None) -> Path:
    """The wheel's ``files`` (under torch_npu/) in the cache, downloaded once; ``derive``
    writes the ``derived`` files from the wheel into the staging ``torch_npu`` folder.
    Callers that need more files pass a superset of FILES, so the folder only grows."""
    dest = _cache() / version / "torch_npu"
    if all((dest / rel).is_file() for rel in (*files, *derived)):
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        # Pinned tags: the .py files are the same in every wheel, and any platform can fetch it.
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
               "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
               "--platform", "manylinux2014_x86_64", "--quiet", f"torch_npu=={version}",
               "-d", tmp]  # fmt: skip
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.SubprocessError) as exc:
            done = SimpleNamespace(returncode=1, stderr=str(exc))
        wheels = list(Path(tmp).glob("torch_npu-*.whl"))
        if done.returncode or not wheels:
            reason = f"cannot download torch_npu=={version}: {done.stderr.strip()[-300:]}"
            print(reason, file=sys.stderr)
            pytest.skip(reason)
        _cache().mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=_cache()))  # same file system: os.replace works
        with zipfile.ZipFile(wheels[0]) as wheel:
            for rel in files:
                target = staging / "torch_npu" / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(wheel.read(f"torch_npu/{rel}"))
            if derive is not None:
                derive(wheel, staging / "torch_npu")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(staging / "torch_npu", dest)  # whole or nothing, for concurrent runs
    shutil.rmtree(staging, ignore_errors=True)
    return dest


@pytest.fixture(scope="session")
def real() -> Path:
    return _download(VERSION)


@pytest.fixture(scope="session")
def real_old() -> Path:
    return _download(OLD)


@pytest.fixture
def fake() -> Iterator[ModuleType]:
    with installed_fake(VERSION) as module:
        yield module


@pytest.fixture
def fake_old() -> Iterator[ModuleType]:
    with installed_fake(OLD) as module:
        yield module


# -- reading them ------------------------------------------------------------------------


def _tree(root: Path, rel: str) -> ast.Module:
    return ast.parse((root / rel).read_text(encoding="utf-8"))


def _find(body: list[ast.stmt], name: str) -> ast.stmt | None:
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            return node
    return None


def _node(root: Path, rel: str, qualname: str) -> ast.FunctionDef | ast.ClassDef:
    body: list[ast.stmt] = _tree(root, rel).body
    node: ast.stmt | None = None
    for part in qualname.split("."):
        node = _find(body, part)
        assert node is not None, f"{rel}: no {qualname} in the real torch_npu"
        body = node.body  # type: ignore[attr-defined]
    assert isinstance(node, (ast.FunctionDef, ast.ClassDef))
    return node


def _real_params(root: Path, rel: str, qualname: str) -> list[tuple[str, str]]:
    node = _node(root, rel, qualname)
    assert isinstance(node, ast.FunctionDef)
    args = node.args
    assert not args.posonlyargs and args.vararg is None and args.kwarg is None
    out = [(a.arg, POS) for a in args.args] + [(a.arg, KW) for a in args.kwonlyargs]
    return [p for p in out if p[0] not in ("self", "cls")]


def _fake_params(fn: Any) -> list[tuple[str, str]]:
    kinds = {inspect.Parameter.POSITIONAL_OR_KEYWORD: POS, inspect.Parameter.KEYWORD_ONLY: KW}
    return [(n, kinds.get(p.kind, str(p.kind))) for n, p in inspect.signature(fn).parameters.items()
            if n not in ("self", "cls")]  # fmt: skip


def _fake_module(rel: str) -> ModuleType:
    dotted = "torch_npu." + rel.removesuffix(".py").replace("/", ".")
    return importlib.import_module(dotted.removesuffix(".__init__"))


def _fake_object(rel: str, qualname: str) -> Any:
    obj: Any = _fake_module(rel)
    for part in qualname.split("."):
        # the fake folds torch_npu's _KinetoProfile base class into profile
        obj = getattr(obj, "profile" if part == "_KinetoProfile" else part)
    return obj


def _constants(root: Path) -> dict[str, object]:
    cls = _node(root, "profiler/analysis/prof_common_func/_constant.py", "Constant")
    out = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = stmt.value.value
    return out


def _class_values(root: Path, rel: str, cls_name: str) -> dict[str, object]:
    """Class attributes, with ``Constant.X`` resolved to its value."""
    constants, out = _constants(root), {}
    cls = _node(root, rel, cls_name)
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
            value = stmt.value
            if isinstance(value, ast.Attribute) and value.attr in constants:
                out[stmt.targets[0].id] = constants[value.attr]
            elif isinstance(value, ast.Constant):
                out[stmt.targets[0].id] = value.value
    return out


# -- the contract ------------------------------------------------------------------------


@pytest.mark.parametrize(("rel", "qualname"), list(SIGNATURES_213))
def test_real_213_signatures(real: Path, fake: ModuleType, rel: str, qualname: str) -> None:
    expected = SIGNATURES_213[(rel, qualname)]
    assert _real_params(real, rel, qualname) == expected
    assert _fake_params(_fake_object(rel, qualname)) == expected


@pytest.mark.parametrize(("rel", "qualname"), list(SIGNATURES_251))
def test_real_251_signatures(real_old: Path, fake_old: ModuleType, rel: str, qualname: str) -> None:
    expected = SIGNATURES_251[(rel, qualname)]
    assert _real_params(real_old, rel, qualname) == expected
    assert _fake_params(_fake_object(rel, qualname)) == expected


def test_constants_match_the_fake(real: Path, fake: ModuleType) -> None:
    for (rel, cls_name), used in ATTRIBUTES.items():
        values = _class_values(real, rel, cls_name)
        assert used <= set(values), f"{cls_name} lacks {used - set(values)}"
        fake_cls = getattr(fake.profiler, cls_name)
        for attr in used:
            fake_value = getattr(fake_cls, attr)
            fake_value = fake_value.value if cls_name == "ProfilerAction" else fake_value
            assert fake_value == values[attr], f"{cls_name}.{attr}"
    assert _constants(real)["MAX_WORKER_NAME_LENGTH"] == 226
    assert backend.WORKER_MAX < 226


def test_exports(real: Path, fake: ModuleType) -> None:
    for rel, names in EXPORTS.items():
        tree = _tree(real, rel)
        bound = {alias.asname or alias.name for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) for alias in node.names}  # fmt: skip
        assert names <= bound, f"{rel} lacks {names - bound}"
        assert names <= set(vars(_fake_module(rel))), rel
    # `from .mstx import mstx` rebinds torch_npu.npu.mstx to the class, in both
    assert "from .mstx import mstx" in (real / "npu/__init__.py").read_text(encoding="utf-8")
    assert inspect.isclass(fake.npu.mstx)


def test_readback_attributes_exist(real: Path, real_old: Path) -> None:
    for root, missing in ((real, set()), (real_old, {"_mstx", "_mstx_domain_include",
                                                     "_mstx_domain_exclude"})):  # fmt: skip
        init = _node(root, "profiler/experimental_config.py", "_ExperimentalConfig.__init__")
        assigned = {t.attr for n in ast.walk(init) if isinstance(n, ast.Assign)
                    for t in n.targets if isinstance(t, ast.Attribute)}  # fmt: skip
        assert READBACK - missing <= assigned


def test_the_quiet_stop_is_real(real: Path) -> None:
    """The backend ends a cycle as RECORD_AND_SAVE -> NONE: torch_npu warns on no other way."""
    init = _node(real, "profiler/profiler.py", "profile.__init__")
    assigned = {t.attr for n in ast.walk(init) if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Attribute)}  # fmt: skip
    assert {"current_action", "step_num", "record_steps"} <= assigned
    step_src = ast.unparse(_node(real, "profiler/profiler.py", "profile.step"))
    assert "prev_action = self.current_action" in step_src
    controller = _tree(real, "profiler/_profiler_action_controller.py")
    table = next(n for n in ast.walk(controller) if isinstance(n, ast.Dict) and len(n.keys) > 10)
    entries = {
        ast.unparse(k): ast.unparse(v) for k, v in zip(table.keys, table.values, strict=True) if k
    }
    quiet = entries["(ProfilerAction.RECORD_AND_SAVE, ProfilerAction.NONE)"]
    assert "print_warn_msg" not in quiet and "finalize_trace" in quiet and "_trace_ready" in quiet
    assert "print_warn_msg" in entries["(ProfilerAction.RECORD, None)"]
    assert "delete_prof_dir" in entries["(ProfilerAction.WARMUP, None)"]
    assert "start_trace" in entries["(ProfilerAction.WARMUP, ProfilerAction.RECORD)"]


def test_folder_name_and_handler_path(real: Path) -> None:
    creator = (real / "profiler/_profiler_path_creator.py").read_text(encoding="utf-8")
    assert '"{}_{}_ascend_pt"' in creator and '"%Y%m%d%H%M%S%f")[:-3]' in creator
    assert "os.getpid()" in creator
    handler = ast.unparse(_node(real, "profiler/profiler.py", "tensorboard_trace_handler"))
    # the path is set when the handler is built, before handler_fn exists
    assert handler.index("ProfPathCreator().init(") < handler.index("def handler_fn")
    start = ast.unparse(_node(real, "profiler/profiler.py", "profile.start"))
    assert "if not self.on_trace_ready" in start and "export_only_mode=True" in start


def test_backend_source_reader_agrees_with_inspect(
    real: Path, real_old: Path, fake: ModuleType
) -> None:
    found = checks.source_params(real)
    mstx_cls = fake.npu.mstx
    prof = fake.profiler
    assert found == {
        "_ExperimentalConfig": backend._keywords(prof._ExperimentalConfig.__init__),
        "profile": backend._keywords(prof.profile.__init__),
        "tensorboard_trace_handler": backend._keywords(prof.tensorboard_trace_handler),
        "range_start": backend._keywords(mstx_cls.range_start),
        "range_end": backend._keywords(mstx_cls.range_end),
    }
    everything = {**schema.defaults("role")["mstx"],
                  "ranges": True, "domain": "engine", "mstx_domain_include": ["engine"],
                  "l2_cache": True, "record_op_args": True, "with_flops": True,
                  "data_simplification": False}  # fmt: skip
    assert checks.version_warnings(everything, found, VERSION) == []
    old = checks.version_warnings(everything, checks.source_params(real_old), OLD)
    assert [m.split("'")[1] for m in old] == ["mstx_domain_include", "domain"]


# -- the schedule ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_schedule(real: Path) -> Iterator[Any]:
    """torch_npu's real Schedule class, imported with stubs for the packages around it."""
    stubs: dict[str, ModuleType] = {}
    packages = ("torch_npu", "torch_npu.utils", "torch_npu.profiler", "torch_npu.profiler.analysis")
    for name in (*packages, "torch_npu.profiler.analysis.prof_common_func"):
        stubs[name] = ModuleType(name)
        stubs[name].__path__ = []
    codes = ModuleType("torch_npu.utils._error_code")
    codes.ErrCode = SimpleNamespace(VALUE="VALUE")  # type: ignore[attr-defined]
    codes.prof_error = lambda code: ""  # type: ignore[attr-defined]
    constant = ModuleType("torch_npu.profiler.analysis.prof_common_func._constant")
    constant.print_warn_msg = lambda message: None  # type: ignore[attr-defined]
    stubs[codes.__name__], stubs[constant.__name__] = codes, constant
    with mock.patch.dict(sys.modules, stubs):
        name = "torch_npu.profiler.scheduler"
        spec = importlib.util.spec_from_file_location(name, real / "profiler/scheduler.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        yield module.Schedule


fields = st.fixed_dictionaries({
    "wait": st.integers(0, 3), "warmup": st.integers(0, 3), "active": st.integers(1, 4),
    "repeat": st.integers(0, 3), "skip_first": st.integers(0, 4),
    "skip_first_wait": st.integers(0, 1),
})  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(fields=fields)
def test_real_npu_schedule_equals_torch_schedule(
    real_schedule: Any, fields: dict[str, int]
) -> None:
    torch_profiler = pytest.importorskip("torch.profiler")
    npu = real_schedule(**fields)  # always by keyword: its positional order is not torch's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch_fn = torch_profiler.schedule(**fields)
    engine = _engine_schedule(fields)
    for step in range(40):
        expected = torch_fn(step).name
        assert npu(step).name == expected, (fields, step)
        if engine is not None:
            assert engine.action(step).name == expected, (fields, step)


def _engine_schedule(fields: dict[str, int]) -> Any:
    try:
        from policy_engine.language.values.schedule import Schedule
    except ImportError:  # written concurrently; compared once it exists
        return None
    return Schedule(**fields)
