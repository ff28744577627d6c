"""The memory backend's Ascend side: NpuMemory, the fake's ``npu.memory``, and the real wheel.

The contract half reads torch_npu 2.13.0 and 2.5.1 as tests/test_torch_npu_contract.py does
(downloaded, never installed, into the same cache; this adds ``npu/memory.py`` and a list
of the strings in ``lib/libtorch_npu.so`` that matter here, since the out-of-memory hook and
the value checks are compiled). Every name and keyword NpuMemory uses is looked up there,
the fake's signatures are compared with the real ones, and the real ``npu/memory.py`` is
loaded over stubs of its compiled half and driven by NpuMemory. The rest drives NpuMemory
through the fake, and checks :func:`detect`.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import pickle
import re
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any
from unittest import mock

import pytest
import test_torch_npu_contract as contract
from npu_fixtures import FAKE_ROOT, installed_fake

from policy_engine.backends.memory import device
from policy_engine.backends.memory.device import NPU_ATTACH, NPU_USES, CudaMemory, NpuMemory

VERSIONS = (contract.VERSION, contract.OLD)
MEMORY = "npu/memory.py"
FILES = (*contract.FILES, MEMORY)
STRINGS = "lib/libtorch_npu.strings"  # derived: the .so itself is ~100 MB
POS, KW, ARGS, KWARGS = contract.POS, contract.KW, "*args", "**kwargs"

# What the real npu/memory.py defines: name -> [(parameter, kind, default source)].
_HISTORY = [("enabled", POS, "'all'"), ("args", ARGS, None), ("kwargs", KWARGS, None)]
_IMPL = [("enabled", POS, "'all'"), ("context", POS, "'all'"), ("stacks", POS, "'all'"),
         ("max_entries", POS, "sys.maxsize"), ("device", POS, "None")]  # fmt: skip
SIGNATURES: dict[str, dict[str, list[tuple[str, str, str | None]]]] = {
    "2.13.0": {
        "_record_memory_history": _HISTORY,
        "_record_memory_history_impl": _IMPL,
        "_snapshot": [("device", POS, "None"), ("augment_with_fx_traces", POS, "False")],
        "_dump_snapshot": [("filename", POS, "'dump_snapshot.pickle'"),
                           ("augment_with_fx_traces", POS, "False")],
    },
    "2.5.1": {
        "_record_memory_history": _HISTORY,
        "_record_memory_history_impl": _IMPL,
        "_snapshot": [("device", POS, "None")],
        "_dump_snapshot": [("filename", POS, "'dump_snapshot.pickle'")],
    },
}  # fmt: skip
# In libtorch_npu.so of both versions: the _C functions, and the values the C++ accepts.
COMPILED = {"_npu_record_memory_history", "_npu_memorySnapshot", NPU_ATTACH}
MESSAGES = {
    "enabled": "expected state to be 'state', 'all', or None",
    "context": "expected context to be 'state', 'alloc', 'all', or None",
    "stacks": "expected stacks to be 'python', or 'all'",
}


# -- getting the sources -----------------------------------------------------------------


def _strings(wheel: zipfile.ZipFile, root: Path) -> None:
    """The symbols and messages of libtorch_npu.so that the checks read (the .so itself is
    ~100 MB)."""
    binary = wheel.read("torch_npu/lib/libtorch_npu.so")
    found = {m.decode() for m in re.findall(rb"[\x20-\x7e]{6,}", binary)
             if m.startswith((b"_npu_", b"expected "))}  # fmt: skip
    (root / STRINGS).parent.mkdir(exist_ok=True)
    (root / STRINGS).write_text("\n".join(sorted(found)) + "\n")


def _download(version: str) -> Path:
    """contract._download's files plus ours, in the same cache folder."""
    return contract._download(version, files=FILES, derived=(STRINGS,), derive=_strings)


@pytest.fixture(scope="module", params=VERSIONS)
def real(request: pytest.FixtureRequest) -> tuple[str, Path]:
    return request.param, _download(request.param)


@pytest.fixture
def npu() -> Iterator[ModuleType]:
    with installed_fake(contract.VERSION) as module:
        yield module


def _functions(root: Path) -> dict[str, ast.FunctionDef]:
    tree = contract._tree(root, MEMORY)
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _real_params(fn: ast.FunctionDef) -> list[tuple[str, str, str | None]]:
    args = fn.args
    assert not args.posonlyargs and not args.kwonlyargs
    defaults = [None] * (len(args.args) - len(args.defaults)) + list(args.defaults)
    out = [(a.arg, POS, None if d is None else ast.unparse(d))
           for a, d in zip(args.args, defaults, strict=True)]  # fmt: skip
    out += [(args.vararg.arg, ARGS, None)] if args.vararg else []
    return out + ([(args.kwarg.arg, KWARGS, None)] if args.kwarg else [])


def _fake_params(fn: Any) -> list[tuple[str, str, str | None]]:
    kinds = {inspect.Parameter.POSITIONAL_OR_KEYWORD: POS, inspect.Parameter.VAR_POSITIONAL: ARGS,
             inspect.Parameter.VAR_KEYWORD: KWARGS}  # fmt: skip
    out = []
    for name, p in inspect.signature(fn).parameters.items():
        default = None if p.default is inspect.Parameter.empty else repr(p.default)
        out.append((name, kinds.get(p.kind, str(p.kind)), default))
    return out


def _as_value(source: str | None) -> str | None:
    return repr(sys.maxsize) if source == "sys.maxsize" else source


# -- the contract ------------------------------------------------------------------------


def test_real_signatures_and_the_fakes(real: tuple[str, Path]) -> None:
    version, root = real
    functions = _functions(root)
    with installed_fake(version) as fake:
        for name, expected in SIGNATURES[version].items():
            assert _real_params(functions[name]) == expected, (version, name)
            values = [(n, k, _as_value(d)) for n, k, d in expected]
            assert _fake_params(getattr(fake.npu.memory, name)) == values, (version, name)


def test_every_name_and_keyword_npu_memory_uses_is_real(real: tuple[str, Path]) -> None:
    version, root = real
    functions = _functions(root)
    for name, keywords in NPU_USES.items():
        params = {p for p, kind, _ in _real_params(functions[name]) if kind == POS}
        if any(kind == KWARGS for _, kind, _ in _real_params(functions[name])):
            # what the wrapper takes besides its own, it hands to <name>_impl
            forward = ast.unparse(functions[name])
            assert f"return {name}_impl(enabled, *args, **kwargs)" in forward, version
            params |= {p for p, kind, _ in _real_params(functions[f"{name}_impl"])}
        assert set(keywords) <= params, (version, name, set(keywords) - params)
    impl = ast.unparse(functions["_record_memory_history_impl"])
    assert "torch_npu._C._npu_record_memory_history(enabled, context, stacks, max_entries)" \
        in impl  # fmt: skip
    init = (root / "npu/__init__.py").read_text(encoding="utf-8")
    assert "from .memory import *" in init  # binds torch_npu.npu.memory, the submodule
    assert "def is_available():" in init


def test_the_compiled_half(real: tuple[str, Path]) -> None:
    version, root = real
    strings = set((root / STRINGS).read_text().splitlines())
    assert strings >= COMPILED, (version, COMPILED - strings)
    assert set(MESSAGES.values()) <= strings, version
    # the fake checks values with the same messages
    with installed_fake(version) as fake:
        for keyword, message in MESSAGES.items():
            with pytest.raises(RuntimeError, match=re.escape(message)):
                fake.npu.memory._record_memory_history(**{keyword: "bogus"})
        assert callable(getattr(fake._C, NPU_ATTACH))


def test_why_dump_pickles_the_snapshot_itself(real: tuple[str, Path]) -> None:
    """torch_npu's _dump_snapshot starts and stops the profiler (2.5.1 always, 2.13.0 when
    saving its usage CSV fails) and, in 2.5.1, creates the file write-only (0o200)."""
    version, root = real
    dump = ast.unparse(_functions(root)["_dump_snapshot"])
    assert "_start_profiler" in dump and "_stop_profiler" in dump, version
    if version == contract.OLD:
        assert "stat.S_IWUSR" in dump and "O_TRUNC" not in dump
    else:
        assert "_npu_saveDevMemUsageInfo" in dump
    assert "_dump_snapshot" not in NPU_USES


@pytest.fixture
def real_memory(real: tuple[str, Path]) -> Iterator[tuple[ModuleType, list[tuple[Any, ...]]]]:
    """The real npu/memory.py, imported over stubs of its compiled half; the calls log."""
    version, root = real
    log: list[tuple[Any, ...]] = []
    top = ModuleType("torch_npu")
    top.__path__ = []
    top.__version__ = version  # type: ignore[attr-defined]
    top._C = SimpleNamespace(  # type: ignore[attr-defined]
        _npu_record_memory_history=lambda *a: log.append(("record", *a)),
        _npu_memorySnapshot=lambda *a: log.append(("snapshot", *a)) or {"segments": []},
    )
    pkg = ModuleType("torch_npu.npu")
    pkg.__path__ = []
    pkg._lazy_init = lambda: None  # type: ignore[attr-defined]
    pkg.is_initialized = pkg._get_device_index = lambda *a: 0  # type: ignore[attr-defined]
    pkg.is_available = lambda: True  # type: ignore[attr-defined]
    top.npu = pkg  # type: ignore[attr-defined]
    utils = ModuleType("torch_npu.npu.utils")
    utils._dummy_type = lambda name: type(name, (), {})  # type: ignore[attr-defined]
    viz = ModuleType("torch_npu.npu._memory_viz")
    viz.memory = viz.segments = lambda *a: ""  # type: ignore[attr-defined]
    codes = ModuleType("torch_npu.utils._error_code")
    codes.ErrCode = SimpleNamespace(VALUE="VALUE")  # type: ignore[attr-defined]
    codes.pta_error = lambda code: ""  # type: ignore[attr-defined]
    stubs = {"torch_npu": top, "torch_npu.npu": pkg, "torch_npu.npu.utils": utils,
             "torch_npu.npu._memory_viz": viz, "torch_npu.utils": ModuleType("torch_npu.utils"),
             "torch_npu.utils._error_code": codes}  # fmt: skip
    with mock.patch.dict(sys.modules, stubs):
        name = "torch_npu.npu.memory"
        spec = importlib.util.spec_from_file_location(name, root / MEMORY)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        yield module, log


def test_npu_memory_drives_the_real_python(
    real_memory: tuple[ModuleType, list[tuple[Any, ...]]], tmp_path: Path
) -> None:
    _module, log = real_memory
    api = NpuMemory()  # the stubbed torch_npu is in sys.modules: no stand-ins needed
    assert api.lacks() == [] and api.unavailable() is None
    api.start(max_entries=1000, stacks="python", context="alloc")
    assert log == [("record", "all", "alloc", "python", 1000)]
    api.dump(str(tmp_path / "s.pickle"))
    assert log[1][0] == "snapshot"
    assert pickle.loads((tmp_path / "s.pickle").read_bytes()) == {"segments": []}
    api.stop()
    assert log[2] == ("record", None, "all", "all", sys.maxsize)


# -- NpuMemory through the fake ----------------------------------------------------------


def test_start_dump_stop(npu: ModuleType, tmp_path: Path) -> None:
    api = NpuMemory()
    assert api.unavailable() is None
    api.start(max_entries=50_000, stacks="all", context="all")
    assert npu.npu.memory.history == {"enabled": "all", "context": "all", "stacks": "all",
                                      "max_entries": 50_000}  # fmt: skip
    path = tmp_path / "rank0.pickle"
    api.dump(str(path))
    api.stop()
    assert npu.npu.memory.history is None
    assert npu._fake.names() == ["memory.record_history", "memory.snapshot",
                                 "memory.record_history"]  # fmt: skip
    assert npu._fake.calls("memory.record_history") == [
        ("memory.record_history", "all", "all", "all", 50_000),
        ("memory.record_history", None, "all", "all", sys.maxsize),
    ]
    snapshot = pickle.loads(path.read_bytes())
    assert set(snapshot) == {"segments", "device_traces"}
    assert os.stat(path).st_mode & 0o600 == 0o600


def test_bad_values_fail_as_torch_npu_does(npu: ModuleType) -> None:
    with pytest.raises(RuntimeError, match="expected stacks"):
        NpuMemory().start(max_entries=1, stacks="cpp", context="all")
    assert npu._fake.calls("memory.record_history") == []


def test_the_fakes_dump_snapshot_writes_a_pickle(npu: ModuleType, tmp_path: Path) -> None:
    npu.npu.memory._dump_snapshot(str(tmp_path / "d.pickle"))
    assert pickle.loads((tmp_path / "d.pickle").read_bytes()) == npu.npu.memory.SNAPSHOT


def test_old_torch_npu_works_the_same(tmp_path: Path) -> None:
    with installed_fake(contract.OLD) as npu:
        api = NpuMemory()
        assert api.unavailable() is None and api.version() == "2.5.1"
        api.start(max_entries=10, stacks="python", context="state")
        api.dump(str(tmp_path / "old.pickle"))
        api.stop()
        assert npu._fake.names() == ["memory.record_history", "memory.snapshot",
                                     "memory.record_history"]  # fmt: skip


def test_no_device(npu: ModuleType) -> None:
    npu._fake.available = False
    reason = NpuMemory().unavailable()
    assert reason == "no Ascend NPU in this process (torch.npu.is_available() is False)"


def test_a_torch_npu_without_the_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    with installed_fake(contract.OLD) as npu:
        monkeypatch.delattr(npu.npu.memory, "_record_memory_history")
        reason = NpuMemory().unavailable()
        assert reason == ("torch_npu 2.5.1 cannot record allocator history: it has no "
                          "torch_npu.npu.memory._record_memory_history")  # fmt: skip


def test_a_torch_npu_without_a_keyword(npu: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    def impl(enabled: Any = "all", context: Any = "all", stacks: str = "all") -> None: ...

    monkeypatch.setattr(npu.npu.memory, "_record_memory_history_impl", impl)
    monkeypatch.delattr(npu.npu.memory, "_snapshot")
    assert NpuMemory().lacks() == [
        "the max_entries= keyword of torch_npu.npu.memory._record_memory_history",
        "torch_npu.npu.memory._snapshot",
    ]
    assert "torch_npu 2.13.0 cannot record" in str(NpuMemory().unavailable())


def test_torch_npu_not_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "torch_npu" or n.startswith("torch_npu.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    assert str(NpuMemory().unavailable()).startswith("torch_npu is not importable (")
    assert NpuMemory().version() == "unknown"
    assert NpuMemory().attach_oom(lambda *a: None) is False


def test_is_available_failing(npu: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> bool:
        raise RuntimeError("drvErr 7")

    monkeypatch.setattr(npu.npu, "is_available", broken)
    reason = NpuMemory().unavailable()
    assert reason == "torch.npu.is_available() failed (RuntimeError: drvErr 7)"


def test_stand_ins() -> None:
    calls: list[tuple[str, Any]] = []
    memory = SimpleNamespace(
        _record_memory_history=lambda **kw: calls.append(("record", kw)),
        _snapshot=lambda: {"segments": []},
    )
    api = NpuMemory(memory=memory, attach=lambda o: calls.append(("attach", o)),
                    available=lambda: False, version="9.9")  # fmt: skip
    assert api.unavailable() == "no Ascend NPU in this process " \
        "(torch.npu.is_available() is False)"  # fmt: skip
    api.start(max_entries=3, stacks="python", context="alloc")
    api.stop()
    assert api.attach_oom(print) is True
    assert calls == [
        ("record", {"enabled": "all", "context": "alloc", "stacks": "python", "max_entries": 3}),
        ("record", {"enabled": None}),
        ("attach", print),
    ]


def test_attach_oom(npu: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, int, int, int]] = []
    assert NpuMemory().attach_oom(lambda *args: seen.append(args)) is True
    npu._fake.out_of_memory(0, 1 << 30, 5, 6)
    assert seen == [(0, 1 << 30, 5, 6)]
    monkeypatch.delattr(npu._C, NPU_ATTACH)
    assert NpuMemory().attach_oom(lambda *args: None) is False


# -- detect ------------------------------------------------------------------------------


def test_detect_by_name() -> None:
    assert isinstance(device.detect("cuda"), CudaMemory)
    assert isinstance(device.detect("npu"), NpuMemory)
    with pytest.raises(ValueError, match="'tpu'"):
        device.detect("tpu")


def test_detect_auto_finds_without_importing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "torch_npu" or n.startswith("torch_npu.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(FAKE_ROOT)
    chosen = device.detect()
    assert isinstance(chosen, NpuMemory) and chosen.device == "npu"
    assert "torch_npu" not in sys.modules


def test_detect_auto_without_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "torch_npu" or n.startswith("torch_npu.")]:
        monkeypatch.delitem(sys.modules, name)
    real_find = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "torch_npu" else real_find(name, *a),
    )
    chosen = device.detect("auto")
    assert isinstance(chosen, CudaMemory) and chosen.device == "cuda"


def test_detect_auto_with_torch_npu_blocked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    assert isinstance(device.detect(), CudaMemory)


def test_detect_auto_with_the_fake(npu: ModuleType) -> None:
    assert isinstance(device.detect(), NpuMemory)
    assert device.detect().unavailable() is None
