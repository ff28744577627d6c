"""The Nsight Systems backend: capture ranges for an ``nsys profile`` launch.

nsys records; the engine only tells it when. The process must run under
``nsys profile --capture-range=...`` with the arguments ``policy-engine nsys-args``
prints. Each recorded schedule cycle is one capture range: ``start()`` opens it (an NVTX
range ``policy_engine.capture`` in domain ``policy_engine``, and/or cudaProfilerStart),
``save()`` closes it. nsys writes one report per range, ``<output>.<N>.nsys-rep`` with N
counted from 1, and the manifest records each range's 0-based ``capture_range`` index so
the files map back to steps. Regions and inner steps are NVTX ranges in ``nsight.domain``.

nvtx and torch are imported only when a capture opens.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, ClassVar

from policy_engine.backends.base import Artifact, BackendUnavailable, CaptureInfo, Session
from policy_engine.backends.files import numbered_reports
from policy_engine.backends.nsight.launch import (
    CAPTURE_DOMAIN,
    CAPTURE_RANGE,
    nsys_output,
    report_path,
    resolve_output,
)
from policy_engine.files.publish import make_tool_folder
from policy_engine.plan.captures import count_ranges
from policy_engine.plan.plan import Plan
from policy_engine.settings.nsight import NO_CUDA

log = logging.getLogger("policy_engine")

#: Set by nsys in the processes it profiles (seen with nsys 2022.4).
ENV_SESSION = "NSYS_PROFILING_SESSION_ID"
ENV_RANGE = "NSYS_NVTX_PROFILER_RANGE"
ENV_DOMAIN = "NSYS_NVTX_PROFILER_DOMAIN"


def session_settings(plan: Plan) -> dict[str, Any]:
    """The settings the runtime passes to captures of ``plan``: the ``nsight`` block plus
    ``output`` (the ``-o`` that ``nsys-args`` gives, with nsys's ``%`` tokens) and
    ``planned_ranges`` (None when the plan cannot say)."""
    settings = dict(plan.settings)
    settings["output"] = nsys_output(plan.template, plan.output_dir)
    settings["planned_ranges"] = count_ranges(plan).total
    return settings


def _import_nvtx() -> Any:
    try:
        return importlib.import_module("nvtx")
    except ImportError as err:
        raise BackendUnavailable(f"nvtx is not importable ({err}): pip install nvtx") from err


def _cuda_profiler(required: bool) -> Any:
    """torch.cuda.profiler when CUDA is usable here, else None (or BackendUnavailable)."""
    if not required and "torch" not in sys.modules:
        return None  # auto: a process that never imported torch runs no CUDA through it
    try:
        import torch
        import torch.cuda.profiler
    except ImportError as err:
        if required:
            raise BackendUnavailable(f"torch is not importable ({err})") from err
        return None
    if torch.cuda.is_available():
        return torch.cuda.profiler
    if required:
        raise BackendUnavailable(NO_CUDA)
    return None


class NsightSession(Session):
    """One capture: a capture range per recorded cycle."""

    #: NVTX start/end ranges and cudaProfilerStart/Stop are process-wide: any thread may
    #: drive the capture.
    any_thread = True

    def __init__(self, backend: NsightBackend, info: CaptureInfo, nvtx: Any, cuda: Any) -> None:
        settings = info.settings
        self._backend = backend
        self._info = info
        self._nvtx = nvtx  # None: cuda_profiler_api with ranges off
        self._cuda = cuda  # None: no cudaProfilerStart (nvtx capture, or auto on CPU)
        self._nvtx_capture = settings["capture"] != "cuda_profiler_api"
        self._ranges = bool(settings["ranges"]) and nvtx is not None
        self._domain = str(settings["domain"])
        self._open_range: Any = None
        self._index: int | None = None
        self._step_range: Any = None
        self._stem = ""

    @property
    def recording(self) -> bool:
        return self._index is not None

    def set_stem(self, stem: str) -> None:
        self._stem = stem

    def prepare(self) -> None:
        # nsys has no warm-up; the folder must exist before nsys writes the report.
        self._backend.make_folder()

    def start(self) -> None:
        if self.recording:
            return
        self._backend.make_folder()
        self._index = index = self._backend.next_index()
        try:
            if self._nvtx_capture:
                self._open_range = self._nvtx.start_range(CAPTURE_RANGE, domain=CAPTURE_DOMAIN)
            if self._cuda is not None:
                self._cuda.start()
        except BaseException:
            self._stop()  # never leave nsys waiting on a half-opened capture
            raise
        if self._nvtx is not None:
            # The report carries who recorded it, as torch traces carry it in metadata.
            meta = dict(self._info.metadata(), capture_range=index)
            self._nvtx.mark(
                f"policy_engine {json.dumps(meta, sort_keys=True)}", domain=CAPTURE_DOMAIN
            )

    def step(self, inner_step: int) -> None:
        if not self._ranges or not self.recording:
            return
        self._end_step()
        # A start/end range, not push/pop: step() may come from another role's thread.
        self._step_range = self._nvtx.start_range(f"ProfilerStep#{inner_step}", domain=self._domain)

    def save(self, stem: str, cycle: int) -> list[Artifact]:
        index = self._stop()
        if index is None:
            return []
        path = self._backend.report(index, stem or self._stem)
        extra = {"capture_range": index, "cycle": cycle, "report": os.path.basename(path)}
        return [Artifact(path, None, extra)]

    def discard(self) -> None:
        # nsys cannot forget a range it saw; closing it keeps nsys from waiting forever.
        self._stop()

    def range(self, name: str) -> AbstractContextManager[object]:
        if not self._ranges or not self.recording:
            return nullcontext()
        return self._region(name)

    @contextmanager
    def _region(self, name: str) -> Iterator[None]:
        # A start/end range, not push/pop: the runtime may open a region's range on the
        # thread where recording starts and close it on the region's own thread.
        rng = self._nvtx.start_range(name, domain=self._domain)
        try:
            yield
        finally:
            self._nvtx.end_range(rng)

    def close(self) -> None:
        self._stop()

    def _end_step(self) -> None:
        rng, self._step_range = self._step_range, None
        if rng is not None:
            self._nvtx.end_range(rng)

    def _stop(self) -> int | None:
        index, self._index = self._index, None
        if index is None:
            return None
        self._end_step()
        try:
            if self._cuda is not None:
                self._cuda.stop()
        finally:
            rng, self._open_range = self._open_range, None
            if rng is not None:
                self._nvtx.end_range(rng)
        return index


class NsightBackend:
    """Once per process: numbers the capture ranges this process opens."""

    name: ClassVar[str] = "nsight"
    extension: ClassVar[str] = ".nsys-rep"
    session: ClassVar[type[Session]] = NsightSession

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._opened = 0
        self._output: str | None = None
        self._output_dir = ""
        self._planned: int | None = None
        self._numbered = True
        self._warned: set[str] = set()

    def open(self, info: CaptureInfo) -> NsightSession:
        settings = info.settings
        capture = settings["capture"]
        _check_launch(capture)
        needs_nvtx = capture != "cuda_profiler_api" or bool(settings["ranges"])
        nvtx = _import_nvtx() if needs_nvtx else None
        cuda = (
            _cuda_profiler(required=capture == "cuda_profiler_api") if capture != "nvtx" else None
        )
        with self._lock:
            self._output_dir = info.output_dir
            output = settings.get("output")
            self._output = (
                None
                if output is None
                else resolve_output(
                    str(output), pid=os.getpid(), host=socket.gethostname(), environ=os.environ
                )
            )
            self._planned = settings.get("planned_ranges")
            self._numbered = numbered_reports(settings)  # as explain names them
        return NsightSession(self, info, nvtx, cuda)

    def next_index(self) -> int:
        with self._lock:
            index, self._opened = self._opened, self._opened + 1
        planned = self._planned
        if planned is not None and index >= planned:
            self._warn_once(
                "beyond",
                f"policy-engine: nsight capture range {index + 1} is beyond the {planned} "
                "the launch arguments planned; nsys will not record it",
            )
        if index == 0 and self._output is not None:
            path = report_path(self._output, 0, numbered=self._numbered)
            if os.path.exists(path):
                self._warn_once(
                    "exists",
                    f"policy-engine: {path} exists already; nsys never overwrites it and "
                    "writes this process's reports to /tmp/nsys-report-*.nsys-rep instead",
                )
        return index

    def make_folder(self) -> None:
        """The folder nsys writes the reports into (nsys does not create it)."""
        folder = os.path.dirname(self._output) if self._output else self._output_dir
        if not folder:
            return
        make_tool_folder(self._output_dir, folder)

    def report(self, index: int, stem: str) -> str:
        """Where nsys writes the report of capture range ``index``."""
        if self._output is None:
            self._warn_once(
                "output",
                "policy-engine: nsight: the runtime gave no nsys "
                "output name (settings['output']); manifest paths use the "
                "engine's names, not the files nsys writes",
            )
            return os.path.join(self._output_dir, stem) + self.extension
        return report_path(self._output, index, numbered=self._numbered)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", message)


def _check_launch(capture: str) -> None:
    """Fail clearly when nsys is not there to see the capture ranges."""
    if ENV_SESSION not in os.environ:
        raise BackendUnavailable(
            "this process does not run under `nsys profile` "
            f"({ENV_SESSION} is unset): launch it with the arguments "
            "`policy-engine nsys-args POLICY --role ROLE` prints"
        )
    wanted = os.environ.get(ENV_RANGE)
    if (
        capture != "cuda_profiler_api"
        and wanted is not None
        and (wanted != CAPTURE_RANGE or os.environ.get(ENV_DOMAIN, "") != CAPTURE_DOMAIN)
    ):
        raise BackendUnavailable(
            f"nsys waits for the NVTX range {wanted}@{os.environ.get(ENV_DOMAIN, '')} but the "
            f"engine opens {CAPTURE_RANGE}@{CAPTURE_DOMAIN}: regenerate the launch arguments "
            "with `policy-engine nsys-args`"
        )


BACKEND = NsightBackend
