"""The PyTorch profiler backend: torch.profiler captures written as Chrome traces.

The engine owns the schedule, so the profiler object is driven through its transition
methods (prepare_trace / start_trace / stop_trace) instead of its own ``schedule=``;
torch then does nothing on steps where the schedule says NONE.

Threads: kineto must be started, stopped and exported on one thread, and records the ops
of that thread (and of the autograd threads it drives) only. torch's
``profile_all_threads`` experimental option would record every thread, but crashes the
process when other threads run ops while a capture starts or stops (seen on torch 2.13),
so it is not used; the runtime keeps every call of a session on its home thread.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import logging
import os
import re
import shutil
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from policy_engine.backends.base import (
    Artifact,
    BackendUnavailable,
    CaptureInfo,
    Session,
    clock_shift_ns,
)
from policy_engine.backends.files import torch_extension
from policy_engine.files.publish import open_temp, write_atomic
from policy_engine.settings.torch import ACTIVITIES as _ACTIVITIES
from policy_engine.settings.torch import FLAGS as _FLAGS

# The settings moved to policy_engine.settings.torch; re-exported for older importers.
from policy_engine.settings.torch import SETTINGS as SETTINGS
from policy_engine.settings.torch import check_runtime as check_runtime
from policy_engine.settings.torch import check_settings as check_settings

log = logging.getLogger("policy_engine")

class EmptyTrace(RuntimeError):
    """torch wrote no usable trace (a full disk, a file-size limit)."""


def check_trace(path: str) -> None:
    """Raise :class:`EmptyTrace` unless ``path`` holds what looks like a whole Chrome trace:
    a JSON object, first and last bytes read, the rest left to the viewer."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(256).lstrip()
        f.seek(max(0, size - 256))
        tail = f.read().rstrip()
    if not head.startswith(b"{") or not tail.endswith(b"}"):
        raise EmptyTrace(f"torch wrote {size} bytes that are not a whole trace (is the disk "
                         "full, or a file-size limit set?)")


def _device() -> str:
    """This process's CUDA device (a rank on cuda:3 plots cuda:3, not cuda:0)."""
    import torch

    return f"cuda:{torch.cuda.current_device()}"


def _distributed() -> bool:
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized())


def _write_trace(finished: Any, path: str, *, gz: bool) -> None:
    """The Chrome trace of ``finished`` (a stopped torch.autograd.profiler.profile) at
    ``path``, an unguessable temporary name; gzipped when ``gz``. torch's own .gz export
    goes through a file in $TMPDIR and gzips whatever it finds there, even nothing;
    exporting beside the target keeps the check and the space on the output folder's disk."""
    shift = clock_shift_ns()
    if not gz:
        finished.export_chrome_trace(path)
        check_trace(path)
        if shift:
            _shift_base(path, shift)
        return
    raw = path + ".json"
    try:
        finished.export_chrome_trace(raw)
        check_trace(raw)
        if shift:
            _shift_base(raw, shift)
        with open(raw, "rb") as src, open_temp(path) as out, \
                gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    finally:
        if os.path.lexists(raw):
            os.unlink(raw)


_BASE_TIME = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d{1,20})')
#: Bytes at each end of a trace looked in for its baseTimeNanoseconds (kineto writes it
#: among the keys before the events).
_EDGE = 1 << 16


def _shift_base(path: str, shift_ns: int) -> None:
    """Move the trace's baseTimeNanoseconds by ``shift_ns`` (the test clock shift:
    backends.base.TEST_CLOCK_SHIFT), in place: the digits are rewritten where they are,
    padded with a space where the new number is shorter (one with more digits than the
    old is left as it is)."""
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        for at in (0, max(0, size - _EDGE)):
            f.seek(at)
            found = _BASE_TIME.search(f.read(_EDGE))
            if found is None:
                continue
            old = found.group(1)
            new = str(max(0, int(old) + shift_ns)).encode()
            if len(new) <= len(old):
                f.seek(at + found.start(1))
                f.write(new + b" " * (len(old) - len(new)))
            return


def _not_empty(path: str) -> None:
    if os.path.getsize(path) == 0:
        raise EmptyTrace("torch wrote nothing (is matplotlib installed?)")


class TorchSession(Session):
    """One capture: a torch.profiler profile driven transition by transition."""

    any_thread = False  # kineto: start, stop and export on one thread
    saves_later = True  # the trace is exported after the profiler stops, on any thread

    def __init__(self, backend: TorchBackend, info: CaptureInfo) -> None:
        try:
            import torch.profiler
        except ImportError as err:
            raise BackendUnavailable(f"torch is not importable ({err}): pip install torch") \
                from err
        settings = info.settings
        self._info = info
        self._gzip = bool(settings["gzip"])
        flags: dict[str, Any] = {flag: bool(settings[flag]) for flag in _FLAGS}
        self._prof = torch.profiler.profile(
            activities=backend.activities(settings["activities"]), **flags)
        # Carried into every trace so tools can read role and rank without parsing names.
        self._prof.preset_metadata_json("policy_engine", json.dumps(info.metadata()))
        # record_function: a user_annotation on the CPU row and, on CUDA, the
        # gpu_user_annotation band that Perfetto, TensorBoard and HTA show.
        self._record = torch.autograd.profiler.record_function
        self._timeline = bool(settings["memory_timeline"])
        self._cuda = "cuda" in settings["activities"] and torch.cuda.is_available()
        self._prepared = False
        self._started = False
        self._step_marker: Any = None
        self._facts: dict[str, Any] = {}

    # The interpreter calls these only on schedule transitions.
    def prepare(self) -> None:
        with warnings.catch_warnings():
            # Each cycle after the first re-prepares the profiler; torch warns that events
            # of earlier cycles are cleared, which is exactly what a per-cycle trace wants.
            warnings.filterwarnings("ignore", message=".*Profiler clears events")
            self._prof.prepare_trace()
        self._prepared = True

    def start(self) -> None:
        if not self._prepared:
            self.prepare()
        self._prof.start_trace()
        self._started = True
        if not _distributed():
            # torch writes distributedInfo only when torch.distributed is up; Holistic Trace
            # Analysis reads each trace's rank from it, so every trace carries one.
            self._prof.add_metadata_json("distributedInfo", json.dumps(
                {"rank": self._info.rank, "world_size": self._info.world}))

    def step(self, inner_step: int) -> None:
        # Same marker torch.profiler's own step() leaves, so trace viewers show steps.
        self._end_marker()
        marker = self._record(f"ProfilerStep#{inner_step}")
        marker.__enter__()  # type: ignore[no-untyped-call]
        self._step_marker = marker

    def note(self, facts: dict[str, Any]) -> None:
        self._facts = dict(facts)

    def save(self, stem: str, cycle: int) -> list[Artifact]:
        return self.save_later(stem, cycle)()

    def save_later(self, stem: str, cycle: int) -> Callable[[], list[Artifact]]:
        """Stop the profiler (here: kineto stops on the thread that started it) and return
        what writes the trace, which any thread may run: it holds the finished profile, and
        the next cycle's prepare() makes torch a new one."""
        if self._started:
            meta = self._info.metadata()
            meta.update(self._facts, cycle=cycle)
            self._prof.add_metadata_json("policy_engine", json.dumps(meta))
        self._stop()
        finished = self._prof.profiler
        extra = self._memory_timeline(stem) if self._timeline else {}
        ext = torch_extension(self._gzip)  # as explain names it (backends.files)
        gz = self._gzip
        output_dir = self._info.output_dir

        def write() -> list[Artifact]:
            path, size = write_atomic(output_dir, stem, ext,
                                      lambda p: _write_trace(finished, p, gz=gz))
            return [Artifact(path, size, extra)]
        return write

    def _memory_timeline(self, stem: str) -> dict[str, Any]:
        """prof.export_memory_timeline() beside the trace: the HTML page when torch can draw
        it (matplotlib, a CUDA device), else its points. Never fails the trace. (torch
        deprecates it in favour of allocator history, the memory backend; the policy asked
        for it, so its FutureWarning is not repeated.)"""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*export_memory_timeline",
                                    category=FutureWarning)
            return self._export_timeline(stem)

    def _export_timeline(self, stem: str) -> dict[str, Any]:
        cuda = self._cuda
        if cuda and importlib.util.find_spec("matplotlib") is not None:
            try:
                path = write_atomic(self._info.output_dir, stem, ".memory.html",
                                    lambda p: self._prof.export_memory_timeline(p, _device()),
                                    check=_not_empty)[0]
                return {"memory_timeline": os.path.relpath(path, self._info.output_dir)}
            except Exception as err:
                log.debug("memory timeline as HTML failed: %r", err)
        try:
            path = write_atomic(
                self._info.output_dir, stem, ".memory.json.gz",
                lambda p: self._prof.export_memory_timeline(p, _device() if cuda else "cpu"),
                check=_not_empty)[0]
            return {"memory_timeline": os.path.relpath(path, self._info.output_dir)}
        except Exception as err:
            log.warning("policy-engine: no memory timeline for %s: %s: %s", stem,
                        type(err).__name__, err)
            return {"memory_timeline_error": f"{type(err).__name__}: {err}"}

    def discard(self) -> None:
        if self._prepared and not self._started:
            # A prepared profiler holds kineto state; start+stop releases it cleanly.
            self._prof.start_trace()
            self._started = True
        self._stop()

    def range(self, name: str) -> AbstractContextManager[object]:
        rng: AbstractContextManager[object] = self._record(name)
        return rng

    def close(self) -> None:
        self._stop()

    def _end_marker(self) -> None:
        marker, self._step_marker = self._step_marker, None
        if marker is not None:
            marker.__exit__(None, None, None)

    def _stop(self) -> None:
        self._end_marker()
        if self._started:
            self._started = self._prepared = False
            self._prof.stop_trace()


class TorchBackend:
    """Once per process: what the process knows about torch's devices."""

    name: ClassVar[str] = "torch"
    extension: ClassVar[str] = ".pt.trace.json.gz"
    session: ClassVar[type[Session]] = TorchSession

    def __init__(self) -> None:
        self._dropped: set[str] = set()  # activities already warned about

    def open(self, info: CaptureInfo) -> TorchSession:
        return TorchSession(self, info)

    def activities(self, names: Any) -> list[Any]:
        """torch's ProfilerActivity values for ``names``; one without its device here is
        dropped with one warning per process."""
        import torch
        from torch.profiler import ProfilerActivity

        available = {"cpu": True, "cuda": torch.cuda.is_available(),
                     "xpu": hasattr(torch, "xpu") and torch.xpu.is_available()}
        out = []
        for name in names:
            if available.get(name):
                out.append(getattr(ProfilerActivity, _ACTIVITIES[name]))
            elif name not in self._dropped:
                self._dropped.add(name)
                log.warning("policy-engine: %s activity dropped: no %s device in this "
                            "process", name, name.upper())
        if not out:
            raise BackendUnavailable(f"none of the activities {list(names)} can run here")
        return out


BACKEND = TorchBackend
