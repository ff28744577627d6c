"""The Ascend NPU backend: ``torch_npu.profiler`` with mstx ranges (``backend: mstx``, ``npu``).

torch_npu swallows its own errors and resets a bad argument to its default with only a
printed line, so this module checks every setting itself (:func:`check_settings`), passes
only valid values, compares the settings with the installed torch_npu's signatures
(:func:`version_warnings`) and reads back what torch_npu kept: a setting that does not take
effect is one clear warning, never a silent drop. torch_npu is imported only by
:meth:`MstxBackend.open`; validation reads its sources instead (importing it without the
Ascend CANN toolkit can break ``import torch``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import multiprocessing
import os
import re
import shutil
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, ClassVar

from policy_engine.backends.base import Artifact, BackendUnavailable, CaptureInfo, Session
from policy_engine.files.publish import make_folders, rename_folder
from policy_engine.settings.mstx import (
    ACTIVITIES,
    AIC_METRICS,
    CANN,
    DOMAINS,
    EXPORT_TYPES,
    FLAGS,
    INSTALL,
    LEVELS,
    Params,
    aic_metrics,
    as_list,
    check_runtime,
    check_settings,
    version_warnings,
)

# The validate-time part and the value tables live in policy_engine.settings.mstx; the
# names imported "as" themselves are re-exported for callers reaching for them here.
from policy_engine.settings.mstx import EMPTY as EMPTY
from policy_engine.settings.mstx import SOURCES as SOURCES
from policy_engine.settings.mstx import source_params as source_params

__all__ = ["ACTIVITIES", "AIC_METRICS", "EXPORT_TYPES", "FLAGS", "LEVELS", "MstxBackend",
           "MstxSession", "check_runtime", "check_settings", "version_warnings"]

# torch_npu names its folder "<worker>_<pid>_<%Y%m%d%H%M%S + ms>_ascend_pt" and refuses worker
# names of 226 characters or more; with 7 pid digits (Linux's most) the folder fits 255 bytes.
WORKER_MAX = 255 - len("_4194304_20250101000000000_ascend_pt")
_UNSAFE = re.compile(r"[^0-9A-Za-z._~-]+")  # torch_npu warns about other path characters



def _keywords(fn: Callable[..., Any]) -> frozenset[str] | None:
    try:
        sig = inspect.signature(fn)  # follows functools.wraps, which torch_npu's decorators use
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return frozenset(n for n, p in sig.parameters.items() if p.kind in kinds) - {"self"}


def worker_name(base: str) -> str:
    """``base`` as torch_npu takes it: safe characters, at most WORKER_MAX (cut + hash)."""
    name = _UNSAFE.sub("-", base) or "capture"
    if len(name) <= WORKER_MAX:
        return name
    return f"{name[: WORKER_MAX - 11]}-{hashlib.sha256(name.encode()).hexdigest()[:10]}"


def _folders(directory: str) -> frozenset[str]:
    try:
        return frozenset(e.name for e in os.scandir(directory) if e.name.endswith("_ascend_pt"))
    except OSError:
        return frozenset()


def _warn(message: str) -> None:
    warnings.warn(f"mstx backend: {message}", RuntimeWarning, stacklevel=3)


class _Cell:
    """The schedule handed to torch_npu: the session sets the action, torch_npu reads it."""

    __slots__ = ("action",)  # no __dict__: torch_npu writes the schedule's __dict__ as JSON

    def __init__(self, action: object) -> None:
        self.action = action

    def __call__(self, step: int) -> object:
        return self.action


class MstxBackend:
    """``torch_npu.profiler.profile`` driven by the engine's schedule."""

    name: ClassVar[str] = "mstx"
    extension: ClassVar[str] = ""  # torch_npu names its own "_ascend_pt" folder
    session: ClassVar[type[Session]]  # MstxSession, set below it

    def __init__(self) -> None:
        self.owner: MstxSession | None = None  # torch_npu has one profiler per process

    def open(self, info: CaptureInfo) -> MstxSession:
        problems = check_settings(info.settings)
        if problems:
            raise ValueError("invalid mstx settings: " + "; ".join(m for m, _ in problems))
        if importlib.util.find_spec("torch_npu") is None:
            raise BackendUnavailable(INSTALL)
        try:
            npu = importlib.import_module("torch_npu")
            prof = importlib.import_module("torch_npu.profiler")
            mstx = importlib.import_module("torch_npu.npu").mstx  # the class, not the module
        except Exception as exc:  # missing CANN libraries surface as OSError, RuntimeError, ...
            raise BackendUnavailable(f"torch_npu failed to import ({exc}); {CANN}") from exc
        params = {
            "_ExperimentalConfig": _keywords(prof._ExperimentalConfig.__init__),
            "profile": _keywords(prof.profile.__init__),
            "tensorboard_trace_handler": _keywords(prof.tensorboard_trace_handler),
            "range_start": _keywords(mstx.range_start),
            "range_end": _keywords(mstx.range_end),
        }
        version = str(getattr(npu, "__version__", "?"))
        for message in version_warnings(info.settings, params, version):
            _warn(message)
        return MstxSession(self, info, prof, mstx, params, version)


class MstxSession(Session):
    """One capture; each recorded cycle gets a fresh torch_npu profiler and handler."""

    def __init__(self, backend: MstxBackend, info: CaptureInfo, prof: Any, mstx: Any,
                 params: Params, version: str):
        self._backend = backend
        self._info, self._s, self._npu_prof, self._mstx = info, info.settings, prof, mstx
        self._params, self._version, self._actions = params, version, prof.ProfilerAction
        self._prof: Any = None
        self._cell: _Cell | None = None
        self._state = "idle"  # idle | warmup | record
        self._stem: str | None = None
        self._worker, self._dir, self._analysed, self._fresh = "", "", False, False
        self._before: frozenset[str] = frozenset()

    def set_stem(self, stem: str) -> None:
        """Name the coming cycle before prepare()/start(); else save() renames the folder."""
        self._stem = stem

    def prepare(self) -> None:
        if self._state == "idle":
            self._begin(self._actions.WARMUP)  # torch_npu: create folder, init, warm up
            self._state = "warmup"

    def start(self) -> None:
        if self._state == "warmup" and self._cell is not None:
            self._cell.action = self._actions.RECORD
            self._prof.step()  # WARMUP -> RECORD: torch_npu starts the warmed-up trace
        elif self._state == "idle":
            self._begin(self._actions.RECORD)
        self._state, self._fresh = "record", True

    def step(self, inner_step: int) -> None:
        # The runtime calls step(n) as each recorded inner step begins, the first one right
        # after start(), whose ProfilerStep# marker torch_npu has just opened.
        if self._state == "record" and not self._fresh:
            self._prof.step()  # RECORD -> RECORD: only torch_npu's ProfilerStep# marker moves
        self._fresh = False

    def save(self, stem: str, cycle: int) -> list[Artifact]:
        if self._state != "record":
            return []
        self._stop()
        found = self._new_folders()
        if not found:
            _warn(f"torch_npu wrote no {self._worker}_*_ascend_pt folder in {self._dir}")
            return []
        return [self._artifact(self._rename(max(found, key=os.path.getmtime), stem))]

    def discard(self) -> None:
        if self._state != "idle":
            self._stop()  # from WARMUP torch_npu finalizes and deletes its folder itself
            for folder in self._new_folders():
                shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        if self._state != "idle":
            self._stop()  # flushes what was recorded; only save() reports it

    def range(self, name: str) -> AbstractContextManager[object]:
        if self._state != "record" or not self._s["ranges"]:
            return nullcontext()
        return self._range(name)

    @contextmanager
    def _range(self, name: str) -> Iterator[None]:
        domain = self._s["domain"]
        start_kw = {"domain": domain} if domain and self._has("range_start", "domain") else {}
        end_kw = {"domain": domain} if domain and self._has("range_end", "domain") else {}
        range_id = self._mstx.range_start(name, None, **start_kw)  # stream None: host side
        try:
            yield
        finally:
            if range_id:  # torch_npu returns 0 when it refused to open the range
                self._mstx.range_end(range_id, **end_kw)

    def _has(self, target: str, keyword: str) -> bool:
        known = self._params.get(target)
        return known is None or keyword in known

    def _only(self, target: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        known = self._params.get(target)  # what this drops, open() warned about
        return kwargs if known is None else {k: v for k, v in kwargs.items() if k in known}

    def _begin(self, action: object) -> None:
        owner = self._backend.owner
        if owner is not None and owner is not self:
            raise RuntimeError(
                "torch_npu has one profiler per process and another capture holds it"
            )
        sub, base = os.path.split(self._stem or self._provisional())
        self._dir = make_folders(self._info.output_dir, sub)
        self._worker, self._before = worker_name(base), _folders(self._dir)
        prof, s = self._npu_prof, self._s
        sent = self._experimental()
        config = prof._ExperimentalConfig(**sent)
        self._readback(config, sent)
        self._analysed = bool(s["analysis"])
        if self._analysed and multiprocessing.current_process().daemon:
            self._analysed = False  # torch_npu refuses to parse in a daemon process
            _warn("analysis: true cannot run in a daemon process; run the offline analyse")
        # Built right before start: the handler sets torch_npu's process-wide output path
        # when it is constructed, not when it runs.
        handler = prof.tensorboard_trace_handler(
            dir_name=self._dir, worker_name=self._worker, analyse_flag=self._analysed
        )
        self._cell = _Cell(action)
        activities = [
            getattr(prof.ProfilerActivity, ACTIVITIES[a])
            for a in s["activities"]
        ]
        kwargs: dict[str, Any] = {k: bool(s[k]) for k in FLAGS}
        kwargs.update(activities=activities, schedule=self._cell, on_trace_ready=handler)
        kwargs["experimental_config"] = config
        self._prof = prof.profile(**self._only("profile", kwargs))
        meta = self._info.metadata()
        if len(meta["steps"]) > 64:  # torch_npu skips a metadata value over 4096 characters
            meta["steps"] = meta["steps"][:1] + meta["steps"][-1:]
        self._backend.owner = self
        try:
            self._prof.add_metadata_json("policy_engine", json.dumps(meta))
            self._prof.start()
        except BaseException:
            self._state = "warmup"  # whatever torch_npu reached, stop() from here ends it
            self._stop()
            raise

    def _experimental(self) -> dict[str, Any]:
        prof, s = self._npu_prof, self._s
        kw: dict[str, Any] = {
            "profiler_level": getattr(prof.ProfilerLevel, LEVELS[s["level"]]),
            # Always explicit: torch_npu 2.13's default (pipe utilization) is reset with a
            # warning below level1, and 2.5.1's default export_type (None) likewise.
            "aic_metrics": getattr(prof.AiCMetrics, AIC_METRICS[aic_metrics(s)]),
            "export_type": [
                getattr(prof.ExportType, EXPORT_TYPES[t])
                for t in as_list(s["export_type"])
            ],
            "mstx": bool(s["ranges"]),
            "data_simplification": bool(s["data_simplification"]),
            "l2_cache": bool(s["l2_cache"]),
            "record_op_args": bool(s["record_op_args"]),
        }
        kw.update({k: list(s[k]) for k in DOMAINS if s[k]})
        known = self._params.get("_ExperimentalConfig")
        if known is not None and "mstx" not in known and "msprof_tx" in known:
            kw["msprof_tx"] = kw.pop("mstx")  # torch_npu < 2.7 names the same switch msprof_tx
        return self._only("_ExperimentalConfig", kw)

    def _readback(self, config: object, sent: Mapping[str, Any]) -> None:
        """Warn about each value torch_npu's own checks replaced (it only prints a line)."""
        for key, value in sent.items():
            kept = getattr(config, key if key == "record_op_args" else f"_{key}", value)
            if (sorted(kept) if isinstance(kept, list) else kept) != (
                sorted(value) if isinstance(value, list) else value
            ):
                _warn(f"torch_npu {self._version} replaced {key}={value!r} by {kept!r}")

    def _provisional(self) -> str:
        i = self._info
        region, step = f"_{i.region}" if i.region else "", f"_step{i.steps[0]}" if i.steps else ""
        return f"{i.role}{region}{step}_rank{i.rank}-of-{i.world}"

    def _stop(self) -> None:
        prof, cell, state = self._prof, self._cell, self._state
        self._prof, self._cell, self._state = None, None, "idle"
        try:
            if state == "record" and cell is not None and hasattr(prof, "current_action"):
                # stop() in RECORD makes torch_npu print "Incorrect schedule"; its own end of a
                # cycle, RECORD_AND_SAVE -> NONE, stops, finalizes and calls the handler quietly.
                prof.current_action, cell.action = self._actions.RECORD_AND_SAVE, self._actions.NONE
                prof.step()
        finally:
            try:
                if prof is not None:
                    prof.stop()  # after NONE a no-op; from WARMUP it finalizes and cleans up
            finally:
                if self._backend.owner is self:
                    self._backend.owner = None

    def _new_folders(self) -> list[str]:
        own = re.compile(re.escape(self._worker) + rf"_{os.getpid()}_\d+_ascend_pt")
        fresh = sorted(_folders(self._dir) - self._before)
        return [os.path.join(self._dir, name) for name in fresh if own.fullmatch(name)]

    def _rename(self, folder: str, stem: str) -> str:
        """Name the folder after ``stem`` if it was unknown at start, keeping torch_npu's tail."""
        sub, base = os.path.split(stem)
        tail = os.path.basename(folder)[len(self._worker) :]  # "_<pid>_<timestamp>_ascend_pt"
        target = os.path.join(self._info.output_dir, sub, worker_name(base) + tail)
        if os.path.normpath(target) == os.path.normpath(folder):
            return folder
        make_folders(self._info.output_dir, sub)
        if not rename_folder(folder, target):
            _warn(f"{target} exists; the capture stays at {folder}")
            return folder
        return target

    def _artifact(self, folder: str) -> Artifact:
        extra: dict[str, Any] = {
            "worker_name": os.path.basename(folder).rsplit("_", 4)[0],
            "torch_npu": self._version,
            "export_type": as_list(self._s["export_type"]),
            "analysed": self._analysed,
        }
        if not self._analysed:
            extra["needs_offline_analysis"] = True
            extra["analyse"] = f"torch_npu.profiler.profiler.analyse({folder!r})"
        size = sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
        return Artifact(path=folder, bytes=size, extra=extra)


MstxBackend.session = MstxSession
BACKEND = MstxBackend
