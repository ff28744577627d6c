"""The Ascend NPU backend, driven against the fake torch_npu in tests/fake_torch_npu."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from npu_fixtures import FAKE_ROOT, installed_fake

from policy_engine.backends.base import BackendUnavailable, CaptureInfo
from policy_engine.backends.mstx import session as backend
from policy_engine.language.schema import build as schema
from policy_engine.settings import mstx as checks

#: An mstx block as a plan carries it: every setting, merged over the schema's defaults.
DEFAULTS: dict[str, Any] = dict(schema.defaults("role")["mstx"])
STEM = "ppo_actor_step2_rank0-of-8_tp0_pid1_20250101000000000"


def make_info(tmp_path: Path, region: str | None = None, **settings: Any) -> CaptureInfo:
    return CaptureInfo(
        role="actor",
        rank=0,
        world=8,
        coords={"tp": 0, "dp": 0},
        region=region,
        steps=(2, 3),
        output_dir=str(tmp_path),
        settings={**DEFAULTS, **settings},
        plan_hash="h1",
        on_error="warn",
    )


def open_session(tmp_path: Path, **settings: Any) -> backend.MstxSession:
    return backend.MstxBackend().open(make_info(tmp_path, **settings))


def calls(npu: ModuleType, name: str) -> list[tuple[Any, ...]]:
    return list(npu._fake.calls(name))


def events(npu: ModuleType) -> list[str]:
    """The call log as short strings: 'profile.start', 'trace:init', 'mstx.range_start'."""
    out = []
    for call in npu._fake.CALLS:
        if call[0] == "trace":
            out.append(f"trace:{call[1]}")
        elif call[0] not in ("marker",):
            out.append(call[0])
    return out


def npu_warnings(npu: ModuleType) -> list[str]:
    return [call[1] for call in calls(npu, "warning")]


@pytest.fixture
def fake_npu() -> Iterator[ModuleType]:
    """The fake torch_npu with 2.13.0's surface."""
    with installed_fake("2.13.0") as module:
        yield module


@pytest.fixture
def fake_npu_251() -> Iterator[ModuleType]:
    """The fake with 2.5.1's surface: no mstx=, no mstx domains."""
    with installed_fake("2.5.1") as module:
        yield module


@pytest.fixture
def no_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# -- availability -------------------------------------------------------------------------


def test_missing_torch_npu_is_backend_unavailable(tmp_path: Path) -> None:
    assert "torch_npu" not in sys.modules
    with pytest.raises(BackendUnavailable, match=r"pip install torch_npu.*CANN"):
        backend.MstxBackend().open(make_info(tmp_path))
    assert checks.check_runtime(DEFAULTS) == [checks.INSTALL]


def test_backend_class_contract() -> None:
    assert backend.BACKEND is backend.MstxBackend
    assert backend.MstxBackend.name == "mstx"
    assert backend.MstxBackend.extension == ""


def _write_package(root: Path, *, domain: bool) -> None:
    """A torch_npu source tree with just the signatures check_runtime reads."""
    pkg = root / "torch_npu"
    (pkg / "profiler").mkdir(parents=True)
    (pkg / "npu").mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (pkg / "version.py").write_text("__version__ = '2.5.1'\n")
    (pkg / "profiler" / "experimental_config.py").write_text(
        "class _ExperimentalConfig:\n"
        "    def __init__(self, profiler_level=0, aic_metrics=0, l2_cache=False,\n"
        "                 msprof_tx=False, data_simplification=True, record_op_args=False,\n"
        "                 export_type=None):\n"
        "        pass\n"
    )
    (pkg / "profiler" / "profiler.py").write_text(
        "def tensorboard_trace_handler(dir_name=None, worker_name=None, analyse_flag=True):\n"
        "    pass\n"
        "class profile:\n"
        "    def __init__(self, *, activities=None, schedule=None, on_trace_ready=None,\n"
        "                 experimental_config=None):\n"
        "        pass\n"
    )
    extra = ", domain='default'" if domain else ""
    (pkg / "npu" / "mstx.py").write_text(
        "class mstx:\n"
        "    @staticmethod\n"
        f"    def range_start(message, stream=None{extra}):\n"
        "        return 0\n"
        "    @staticmethod\n"
        f"    def range_end(range_id{extra}):\n"
        "        pass\n"
    )


def test_check_runtime_reads_sources_without_importing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_package(tmp_path, domain=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ASCEND_HOME_PATH", "/usr/local/Ascend/ascend-toolkit/latest")
    settings = {
        **DEFAULTS,
        "domain": "engine",
        "mstx_domain_include": ["engine"],
        "with_flops": True,
    }
    problems = checks.check_runtime(settings)
    assert "torch_npu" not in sys.modules
    assert problems == [
        "torch_npu 2.5.1 has no 'mstx_domain_include' argument in _ExperimentalConfig: "
        "mstx.mstx_domain_include is ignored there (a newer torch_npu supports it)",
        "torch_npu 2.5.1 has no 'with_flops' argument in profile: mstx.with_flops is ignored "
        "there (a newer torch_npu supports it)",
        "torch_npu 2.5.1 has no 'domain' argument in range_start: mstx.domain is ignored "
        "there (a newer torch_npu supports it)",
    ]


def test_check_runtime_reports_missing_cann_and_msprof(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_package(tmp_path, domain=True)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no msprof here
    problems = checks.check_runtime({**DEFAULTS, "export_type": ["text", "db"]})
    assert problems[0].startswith("the Ascend CANN environment is not set")
    assert problems[-1].startswith("export_type db needs CANN's msprof on PATH")


def test_check_runtime_asks_msprof_about_db(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    msprof = tmp_path / "msprof"
    msprof.write_text("#!/bin/sh\necho 'usage: msprof --output=<dir> --application=<app>'\n")
    msprof.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert checks._db_problem() == "export_type db: this CANN's msprof cannot export db"
    msprof.write_text("#!/bin/sh\necho '  --type  <text|db>  export type'\n")
    assert checks._db_problem() is None


# -- what is passed to torch_npu ----------------------------------------------------------


def test_start_builds_config_then_handler_then_profile(
    fake_npu: ModuleType, tmp_path: Path, no_warnings: None
) -> None:
    session = open_session(tmp_path)
    session.set_stem(STEM)
    session.start()
    assert events(fake_npu) == [
        "_ExperimentalConfig",
        "tensorboard_trace_handler",
        "profile",
        "profile.start",
        "trace:start",
    ]
    (config_call,) = calls(fake_npu, "_ExperimentalConfig")
    sent = config_call[1]
    assert sent["profiler_level"] == "Level1"
    assert sent["aic_metrics"] == "ACL_AICORE_PIPE_UTILIZATION"
    assert sent["mstx"] is True and sent["msprof_tx"] is False
    assert sent["export_type"] == ["text"]
    assert sent["data_simplification"] is True
    (handler_call,) = calls(fake_npu, "tensorboard_trace_handler")
    assert handler_call[1] == {
        "dir_name": str(tmp_path),
        "worker_name": STEM,
        "analyse_flag": False,
        "async_mode": False,
    }
    (profile_call,) = calls(fake_npu, "profile")
    kwargs = profile_call[1]
    activity = fake_npu.profiler.ProfilerActivity
    assert kwargs["activities"] == [activity.CPU, activity.NPU]
    assert kwargs["experimental_config"] is session._prof.experimental_config
    assert callable(kwargs["schedule"]) and callable(kwargs["on_trace_ready"])
    for flag in ("record_shapes", "profile_memory", "with_stack", "with_modules", "with_flops"):
        assert kwargs[flag] is False
    session.close()


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"level": "level0"}, {"profiler_level": "Level0", "aic_metrics": "ACL_AICORE_NONE"}),
        (
            {"level": "level_none", "aic_metrics": "none"},
            {"profiler_level": "Level_none", "aic_metrics": "ACL_AICORE_NONE", "mstx": True},
        ),
        (
            {"level": "level2", "aic_metrics": "memory_ub"},
            {"profiler_level": "Level2", "aic_metrics": "ACL_AICORE_MEMORY_UB"},
        ),
        ({"aic_metrics": "none"}, {"aic_metrics": "ACL_AICORE_NONE"}),
        ({"export_type": ["text", "db"]}, {"export_type": ["text", "db"]}),
        ({"export_type": "db"}, {"export_type": ["db"]}),
        ({"ranges": False}, {"mstx": False}),
        (
            {"l2_cache": True, "record_op_args": True, "data_simplification": False},
            {"l2_cache": True, "record_op_args": True, "data_simplification": False},
        ),
        (
            {"mstx_domain_include": ["engine", "user"]},
            {"mstx_domain_include": ["engine", "user"], "mstx_domain_exclude": None},
        ),
        ({"mstx_domain_exclude": ["noisy"]}, {"mstx_domain_exclude": ["noisy"]}),
    ],
)
def test_experimental_config_from_settings(
    fake_npu: ModuleType, tmp_path: Path, no_warnings: None, settings: dict[str, Any],
    expected: dict[str, Any],
) -> None:  # fmt: skip
    session = open_session(tmp_path, **settings)
    session.start()
    sent = calls(fake_npu, "_ExperimentalConfig")[0][1]
    assert {key: sent[key] for key in expected} == expected
    assert npu_warnings(fake_npu) == []  # torch_npu had nothing to reset
    session.close()


def test_profile_flags_and_activities(fake_npu: ModuleType, tmp_path: Path) -> None:
    flags = {"record_shapes": True, "profile_memory": True, "with_stack": True,
             "with_modules": True, "with_flops": True}  # fmt: skip
    session = open_session(tmp_path, activities=["npu"], **flags)
    session.start()
    kwargs = calls(fake_npu, "profile")[0][1]
    assert kwargs["activities"] == [fake_npu.profiler.ProfilerActivity.NPU]
    assert {k: kwargs[k] for k in flags} == flags
    session.close()


def test_metadata_carries_role_and_rank(fake_npu: ModuleType, tmp_path: Path) -> None:
    session = open_session(tmp_path)
    session.set_stem(STEM)
    session.start()
    (artifact,) = session.save(STEM, 0)
    meta = json.loads((Path(artifact.path) / "profiler_metadata.json").read_text())
    assert meta["policy_engine"]["role"] == "actor"
    assert meta["policy_engine"]["rank"] == 0
    assert meta["policy_engine"]["coords"] == {"tp": 0, "dp": 0}


# -- the transitions ----------------------------------------------------------------------


def test_warmup_record_save_in_order_without_torch_npu_warnings(
    fake_npu: ModuleType, tmp_path: Path, no_warnings: None
) -> None:
    session = open_session(tmp_path)
    session.set_stem(STEM)
    session.prepare()
    assert events(fake_npu)[-2:] == ["profile.start", "trace:warmup"]
    session.start()
    assert events(fake_npu)[-2:] == ["profile.step", "trace:start"]
    n = len(fake_npu._fake.CALLS)
    session.step(1)  # the runtime's step for the first recorded step: its marker is open
    assert len(fake_npu._fake.CALLS) == n
    session.step(2)
    assert events(fake_npu)[-1] == "profile.step"
    artifacts = session.save(STEM, 0)
    assert events(fake_npu)[-4:] == ["profile.step", "trace:stop", "trace:finalize", "profile.stop"]
    # the RECORD_AND_SAVE -> NONE path: torch_npu prints no "Incorrect schedule"
    assert npu_warnings(fake_npu) == []
    markers = [c[1] for c in calls(fake_npu, "marker")]
    assert markers == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]
    (artifact,) = artifacts
    assert re.fullmatch(
        re.escape(STEM) + rf"_{os.getpid()}_\d{{17}}_ascend_pt", Path(artifact.path).name
    )
    assert Path(artifact.path).parent == tmp_path
    assert artifact.bytes is not None and artifact.bytes > 0
    assert artifact.extra["needs_offline_analysis"] is True
    assert artifact.extra["analyse"] == f"torch_npu.profiler.profiler.analyse({artifact.path!r})"
    assert artifact.extra["worker_name"] == STEM
    assert artifact.extra["analysed"] is False
    assert calls(fake_npu, "trace")[-1][1] != "analyse"
    session.close()
    assert events(fake_npu)[-1] == "profile.stop"  # close after save adds nothing


def test_analysis_true_parses_when_saved(fake_npu: ModuleType, tmp_path: Path) -> None:
    session = open_session(tmp_path, analysis=True)
    session.set_stem(STEM)
    session.start()
    (artifact,) = session.save(STEM, 0)
    assert calls(fake_npu, "tensorboard_trace_handler")[0][1]["analyse_flag"] is True
    assert "trace:analyse" in events(fake_npu)
    assert (Path(artifact.path) / "ASCEND_PROFILER_OUTPUT").is_dir()
    assert artifact.extra["analysed"] is True
    assert "needs_offline_analysis" not in artifact.extra


def test_analysis_in_a_daemon_process_falls_back_to_offline(
    fake_npu: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        backend.multiprocessing, "current_process", lambda: SimpleNamespace(daemon=True)
    )
    session = open_session(tmp_path, analysis=True)
    with pytest.warns(RuntimeWarning, match="daemon process"):
        session.start()
    (artifact,) = session.save(STEM, 0)
    assert calls(fake_npu, "tensorboard_trace_handler")[0][1]["analyse_flag"] is False
    assert artifact.extra["needs_offline_analysis"] is True


def test_handler_is_built_right_before_each_start(fake_npu: ModuleType, tmp_path: Path) -> None:
    session = open_session(tmp_path)
    paths = []
    for cycle in range(2):
        session.set_stem(f"actor_cycle{cycle}")
        session.start()
        session.step(cycle)
        paths += [a.path for a in session.save(f"actor_cycle{cycle}", cycle)]
    seen = events(fake_npu)
    starts = [i for i, e in enumerate(seen) if e == "profile.start"]
    assert len(starts) == 2
    for i in starts:
        assert seen[i - 2 : i] == ["tensorboard_trace_handler", "profile"]
    workers = [c[1]["worker_name"] for c in calls(fake_npu, "tensorboard_trace_handler")]
    assert workers == ["actor_cycle0", "actor_cycle1"]
    assert [Path(p).name.split("_")[1] for p in paths] == ["cycle0", "cycle1"]


def test_save_renames_the_folder_when_the_name_came_late(
    fake_npu: ModuleType, tmp_path: Path
) -> None:
    session = open_session(tmp_path)
    session.prepare()  # no set_stem(): a provisional name from the capture info
    worker = calls(fake_npu, "tensorboard_trace_handler")[0][1]["worker_name"]
    assert worker == "actor_step2_rank0-of-8"
    session.start()
    (artifact,) = session.save("sub/" + STEM, 0)
    path = Path(artifact.path)
    assert path.parent == tmp_path / "sub"
    assert re.fullmatch(re.escape(STEM) + rf"_{os.getpid()}_\d{{17}}_ascend_pt", path.name)
    assert path.is_dir()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(worker)]


def test_long_and_odd_names_are_made_acceptable_to_torch_npu(
    fake_npu: ModuleType, tmp_path: Path
) -> None:
    long_stem = "actor_" + "x" * 300 + "_lr=3e-4+warm"
    session = open_session(tmp_path)
    session.set_stem(long_stem)
    session.start()
    (artifact,) = session.save(long_stem, 0)
    worker = calls(fake_npu, "tensorboard_trace_handler")[0][1]["worker_name"]
    assert len(worker) == backend.WORKER_MAX < 226
    assert worker == backend.worker_name(long_stem)  # deterministic
    assert re.fullmatch(r"actor_x+-[0-9a-f]{10}", worker)
    assert len(Path(artifact.path).name.encode()) <= 255
    assert npu_warnings(fake_npu) == []  # torch_npu kept the name
    assert backend.worker_name("step2_lr=3e-4+warm") == "step2_lr-3e-4-warm"


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=0, max_size=400))
def test_worker_names_are_safe_short_and_deterministic(base: str) -> None:
    name = backend.worker_name(base)
    assert re.fullmatch(r"[0-9A-Za-z._~-]+", name)
    assert len(name) <= backend.WORKER_MAX
    assert name == backend.worker_name(base)
    if re.fullmatch(r"[0-9A-Za-z._~-]{1,219}", base):
        assert name == base


def test_importing_the_backend_imports_no_torch() -> None:
    code = (
        "import sys, policy_engine.backends.mstx.session as m\n"
        "from policy_engine.language.schema.build import defaults\n"
        "m.check_settings(defaults('role')['mstx'])\n"
        "assert not {'torch', 'torch_npu'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_discard_from_warmup_leaves_nothing(fake_npu: ModuleType, tmp_path: Path) -> None:
    session = open_session(tmp_path)
    session.set_stem(STEM)
    session.prepare()
    session.discard()
    # no quiet way out of WARMUP: torch_npu prints its "Incorrect schedule" line here
    assert events(fake_npu)[-4:] == ["profile.stop", "warning", "trace:finalize", "trace:delete"]
    assert list(tmp_path.iterdir()) == []
    assert session._backend.owner is None
    n = len(fake_npu._fake.CALLS)
    session.discard()
    session.close()
    assert len(fake_npu._fake.CALLS) == n


def test_discard_while_recording_stops_and_removes(fake_npu: ModuleType, tmp_path: Path) -> None:
    session = open_session(tmp_path)
    session.start()
    session.discard()
    assert "trace:stop" in events(fake_npu)
    assert list(tmp_path.iterdir()) == []
    assert session.save(STEM, 0) == []


def test_close_while_recording_stops_and_keeps_the_data(
    fake_npu: ModuleType, tmp_path: Path
) -> None:
    session = open_session(tmp_path)
    session.start()
    session.close()
    assert events(fake_npu)[-3:] == ["trace:stop", "trace:finalize", "profile.stop"]
    assert len(list(tmp_path.iterdir())) == 1
    assert session._backend.owner is None
    session.close()  # idempotent


def test_repeated_transitions_are_tolerated(fake_npu: ModuleType, tmp_path: Path) -> None:
    """Colocated roles share one session; a repeated call must not start a second profiler."""
    session = open_session(tmp_path)
    session.step(0)  # before start: nothing to advance
    assert session.save(STEM, 0) == []
    session.prepare()
    session.prepare()
    session.start()
    session.start()
    session.prepare()
    assert len(calls(fake_npu, "profile")) == 1
    assert calls(fake_npu, "error") == []
    session.close()


def test_one_torch_npu_profiler_per_process(fake_npu: ModuleType, tmp_path: Path) -> None:
    shared = backend.MstxBackend()  # one per process, as the runtime keeps it
    first, second = (shared.open(make_info(tmp_path)), shared.open(make_info(tmp_path)))
    first.set_stem("first")
    second.set_stem("second")
    first.start()
    with pytest.raises(RuntimeError, match="one profiler per process"):
        second.start()
    first.save("first", 0)
    second.start()
    assert [Path(a.path).name.split("_")[0] for a in second.save("second", 0)] == ["second"]


def test_a_failing_start_leaves_torch_npu_stopped(
    fake_npu: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(self: Any) -> None:
        raise RuntimeError("device lost")

    monkeypatch.setattr(fake_npu.profiler.profile, "start", boom)
    session = open_session(tmp_path)
    with pytest.raises(RuntimeError, match="device lost"):
        session.start()
    assert events(fake_npu).count("profile.stop") == 1
    assert session._backend.owner is None
    session.close()
    assert events(fake_npu).count("profile.stop") == 1


def test_a_failing_stop_still_stops_torch_npu(
    fake_npu: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = open_session(tmp_path)
    session.start()

    def boom(self: Any) -> None:
        raise RuntimeError("step failed")

    monkeypatch.setattr(fake_npu.profiler.profile, "step", boom)
    with pytest.raises(RuntimeError, match="step failed"):
        session.close()
    assert events(fake_npu)[-4:] == ["profile.stop", "warning", "trace:stop", "trace:finalize"]
    assert session._backend.owner is None
    session.close()  # already idle


# -- regions ------------------------------------------------------------------------------


def test_ranges_only_while_recording(fake_npu: ModuleType, tmp_path: Path) -> None:
    session = open_session(tmp_path)
    with session.range("before"):
        pass
    session.prepare()
    with session.range("warming"):
        pass
    session.start()
    with session.range("update_actor"):
        pass
    session.save(STEM, 0)
    with session.range("after"):
        pass
    starts = calls(fake_npu, "mstx.range_start")
    assert [(c[1], c[2], c[3]) for c in starts] == [("update_actor", None, "default")]
    ends = calls(fake_npu, "mstx.range_end")
    assert [c[1] for c in ends] == [starts[0][4]]


def test_a_range_ends_when_its_body_raises(fake_npu: ModuleType, tmp_path: Path) -> None:
    session = open_session(tmp_path, domain="engine")
    session.start()
    with pytest.raises(ValueError, match="boom"), session.range("compute_log_prob"):
        raise ValueError("boom")
    (start,) = calls(fake_npu, "mstx.range_start")
    (end,) = calls(fake_npu, "mstx.range_end")
    assert start[3] == "engine" and end == ("mstx.range_end", start[4], "engine")
    session.close()


def test_no_ranges_when_switched_off(fake_npu: ModuleType, tmp_path: Path) -> None:
    session = open_session(tmp_path, ranges=False)
    session.start()
    with session.range("update_actor"):
        pass
    assert calls(fake_npu, "mstx.range_start") == []
    session.close()


# -- version differences ------------------------------------------------------------------


def test_torch_npu_251_uses_msprof_tx_and_warns_once_per_missing_keyword(
    fake_npu_251: ModuleType, tmp_path: Path
) -> None:
    with pytest.warns(RuntimeWarning) as record:
        session = open_session(tmp_path, domain="engine", mstx_domain_include=["engine"])
    messages = [str(w.message) for w in record]
    assert messages == [
        "mstx backend: torch_npu 2.5.1 has no 'mstx_domain_include' argument in "
        "_ExperimentalConfig: mstx.mstx_domain_include is ignored there (a newer torch_npu "
        "supports it)",
        "mstx backend: torch_npu 2.5.1 has no 'domain' argument in range_start: mstx.domain is "
        "ignored there (a newer torch_npu supports it)",
    ]
    session.start()
    sent = calls(fake_npu_251, "_ExperimentalConfig")[0][1]
    assert sent["msprof_tx"] is True and "mstx" not in sent
    with session.range("update_actor"):
        pass
    (start,) = calls(fake_npu_251, "mstx.range_start")
    assert start[3] is None  # called without domain=
    assert npu_warnings(fake_npu_251) == []
    session.close()


def test_a_value_torch_npu_replaces_silently_is_reported(
    fake_npu_251: ModuleType, tmp_path: Path
) -> None:
    session = open_session(tmp_path, aic_metrics="none")
    with pytest.warns(RuntimeWarning, match=r"replaced aic_metrics='ACL_AICORE_NONE' by "
                                            r"'ACL_AICORE_PIPE_UTILIZATION'"):  # fmt: skip
        session.start()
    session.close()


@pytest.mark.parametrize(
    ("params", "settings", "expected"),
    [
        ({"_ExperimentalConfig": frozenset({"msprof_tx"})}, {}, []),
        (
            {"_ExperimentalConfig": frozenset({"l2_cache"})},
            {"ranges": True},
            ["torch_npu 9.9 has no 'mstx' argument in _ExperimentalConfig: mstx.ranges is "
             "ignored there (a newer torch_npu supports it)"],
        ),
        ({"_ExperimentalConfig": frozenset()}, {"ranges": False}, []),
        ({"_ExperimentalConfig": None}, {"l2_cache": True}, []),
        (
            {"_ExperimentalConfig": frozenset({"mstx"})},
            {"data_simplification": False},
            ["torch_npu 9.9 has no 'data_simplification' argument in _ExperimentalConfig: "
             "mstx.data_simplification is ignored there (a newer torch_npu supports it)"],
        ),
        ({"range_start": frozenset({"message"})}, {"domain": "x", "ranges": False}, []),
    ],
)  # fmt: skip
def test_version_warnings(
    params: dict[str, frozenset[str] | None], settings: dict[str, Any], expected: list[str]
) -> None:
    assert checks.version_warnings({**DEFAULTS, **settings}, params, "9.9") == expected


def test_signatures_are_read_from_the_installed_package(fake_npu_251: ModuleType) -> None:
    mstx_cls = fake_npu_251.npu.mstx
    assert backend._keywords(mstx_cls.range_start) == frozenset({"message", "stream"})
    assert backend._keywords(fake_npu_251.profiler.profile.__init__) >= {"activities", "schedule"}
    assert backend._keywords(lambda **kw: None) is None


# -- settings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, []),
        ({"activities": []}, [(checks.EMPTY, ("activities",))]),
        (
            {"level": "level0", "aic_metrics": "memory"},
            [("aic_metrics 'memory' needs level1 or level2 (torch_npu resets it to none at "
              "level0)", ("aic_metrics",))],
        ),
        ({"level": "level0", "aic_metrics": "none"}, []),
        (
            {"level": "level_none", "ranges": False},
            [("level_none records only mstx ranges: set ranges: true", ("ranges",))],
        ),
        (
            {"mstx_domain_include": ["a"], "mstx_domain_exclude": ["b"]},
            [("mstx_domain_exclude cannot be set with mstx_domain_include (torch_npu keeps only "
                  "the include list)",
              ("mstx_domain_exclude",))],
        ),
        (
            {"mstx_domain_include": ["a"], "ranges": False},
            [("mstx_domain_include needs ranges: true (torch_npu ignores it while mstx is off)",
              ("mstx_domain_include",))],
        ),
        (
            {"mstx_domain_include": ["user"], "domain": "engine"},
            [("domain 'engine' is filtered out by the mstx_domain_* lists", ("domain",))],
        ),
        (
            {"mstx_domain_exclude": ["engine"], "domain": "engine"},
            [("domain 'engine' is filtered out by the mstx_domain_* lists", ("domain",))],
        ),
        ({"mstx_domain_include": ["engine"], "domain": "engine"}, []),
        (
            {"activities": ["cpu"], "l2_cache": True, "aic_metrics": "memory"},
            [("aic_metrics needs npu in activities (torch_npu ignores it without NPU)",
              ("aic_metrics",)),
             ("l2_cache needs npu in activities (torch_npu ignores it without NPU)",
              ("l2_cache",))],
        ),
    ],
)  # fmt: skip
def test_check_settings(settings: dict[str, Any], expected: list[Any]) -> None:
    assert checks.check_settings({**DEFAULTS, **settings}) == expected


def test_open_refuses_invalid_settings(fake_npu: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="activities is empty"):
        open_session(tmp_path, activities=[])
    assert fake_npu._fake.CALLS == []


def test_registry_finds_the_backend() -> None:
    from policy_engine import settings as backends

    assert backends.canonical("npu") == "mstx"
    assert backends.checks("npu") is checks
    assert backends.check_settings("npu", {**DEFAULTS, "activities": []}) == [
        (checks.EMPTY, ("activities",))]


def test_schema_values_match_torch_npu_tables() -> None:
    schema_path = Path(__file__).parents[1] / "schemas" / "profile_policy.schema.json"
    mstx = json.loads(schema_path.read_text())["$defs"]["mstx"]
    props = mstx["properties"]
    assert mstx["additionalProperties"] is False
    assert props["level"]["enum"] == list(backend.LEVELS)
    assert sorted(props["aic_metrics"]["oneOf"][0]["enum"]) == sorted(backend.AIC_METRICS)
    assert props["activities"]["items"]["enum"] == list(backend.ACTIVITIES)
    assert props["export_type"]["oneOf"][0]["enum"] == list(backend.EXPORT_TYPES)
    used = {key for key, _, _ in checks._NEEDS} | set(backend.FLAGS) | set(DEFAULTS)
    assert used | {"aic_metrics"} <= set(props)


def test_the_fake_is_not_left_behind(fake_npu: ModuleType) -> None:
    assert sys.modules["torch_npu"] is fake_npu
    assert FAKE_ROOT in sys.path


def test_the_fake_is_gone_afterwards() -> None:
    assert "torch_npu" not in sys.modules
    assert FAKE_ROOT not in sys.path


# -- through the runtime ------------------------------------------------------------------


def _policy(out: Path, **roles: dict[str, Any]) -> dict[str, Any]:
    return {"version": 1, "prefix": "t", "output_dir": str(out), "roles": roles}


def _manifest(out: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted((out / "manifests").glob("*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line]
    return [row for row in rows if row.get("event", "trace") == "trace"]


def test_runtime_drives_cycles_and_regions(fake_npu: ModuleType, tmp_path: Path) -> None:
    from policy_engine import profile_session
    from policy_engine.plan.topology import Topology

    role = {
        "enabled": True, "backend": "npu", "steps": [1], "ranks": "all", "regions": ["update"],
        "schedule": {"wait": 1, "warmup": 1, "active": 2, "repeat": 2},
        "mstx": {"level": "level0", "domain": "engine"},
        "name": "<prefix>_<role>_step<step>_c<cycle>_rank<rank>-of-<world>",
    }  # fmt: skip
    prof = profile_session(_policy(tmp_path, actor=role), "actor", topology=Topology(0, 2))
    for n in range(3):
        with prof.training_step(n):
            for _ in range(10):
                with prof.region("update"):
                    pass
                prof.step()
    prof.close()
    rows = _manifest(tmp_path)
    assert [(r["cycle"], r["inner_steps"], r["status"]) for r in rows] == [
        (0, [2, 3], "complete"),
        (1, [6, 7], "complete"),
    ]
    for row, cycle in zip(rows, (0, 1), strict=True):
        stem = f"t_actor_step1_c{cycle}_rank0-of-2"
        assert re.fullmatch(re.escape(stem) + rf"_{os.getpid()}_\d{{17}}_ascend_pt", row["path"])
        assert (tmp_path / row["path"]).is_dir()
        assert row["extra"]["needs_offline_analysis"] is True
    assert npu_warnings(fake_npu) == []
    assert len(calls(fake_npu, "mstx.range_start")) == 4  # two recorded steps per cycle
    assert {c[3] for c in calls(fake_npu, "mstx.range_start")} == {"engine"}
    assert len(calls(fake_npu, "profile.start")) == 2  # one torch_npu profiler per cycle


def test_colocated_roles_share_one_torch_npu_profiler(fake_npu: ModuleType, tmp_path: Path) -> None:
    from policy_engine import profile_session
    from policy_engine.plan.topology import Topology

    role = {"enabled": True, "backend": "mstx", "steps": [1], "ranks": "all",
            "schedule": {"warmup": 1, "active": 2, "repeat": 1}}  # fmt: skip
    policy = _policy(
        tmp_path, actor={**role, "regions": ["update"]}, ref={**role, "regions": ["fwd"]}
    )
    actor = profile_session(policy, "actor", topology=Topology(0, 1))
    ref = profile_session(policy, "ref", topology=Topology(0, 1))
    for n in range(3):
        with actor.training_step(n), ref.training_step(n):
            for _ in range(4):
                with actor.region("update"):
                    pass
                with ref.region("fwd"):
                    pass
                actor.step()
    actor.close()
    ref.close()
    assert len(calls(fake_npu, "profile.start")) == 1
    assert calls(fake_npu, "error") == [] and npu_warnings(fake_npu) == []
    assert [c[1] for c in calls(fake_npu, "mstx.range_start")] == ["update", "fwd"] * 2
    (row,) = _manifest(tmp_path)
    assert row["role"] == "actor" and row["joined"] == ["ref"]
