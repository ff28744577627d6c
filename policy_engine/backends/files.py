"""The files a backend writes for one trace name: the suffixes its session names its
outputs with, and, from them, the list ``explain --format json`` gives for every trace.

A trace name (:meth:`Plan.capture_name <policy_engine.plan.plan.Plan.capture_name>`) is
the same for every backend of a role; each backend adds its own ending:

* torch: ``<name>.pt.trace.json.gz`` (``.pt.trace.json`` with ``gzip: false``);
* memory: ``<name>.pickle`` per saved cycle, and (``on_oom: true``) ``<name>_oom.pickle``
  only when the process runs out of memory while the capture runs (at most one per
  capture);
* mstx: torch_npu's folder ``<name>_<pid>_<npu_timestamp>_ascend_pt/`` (the time is
  torch_npu's own; the name cut to what torch_npu accepts);
* nsight: nsys's report for the process, ``<output>.<N>.nsys-rep``, numbered by capture
  range from 1 (unnumbered when the launch ends at the first range).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

TORCH_GZIP, TORCH_PLAIN = ".pt.trace.json.gz", ".pt.trace.json"
SNAPSHOT = ".pickle"  # a memory snapshot
OOM = "_oom"  # added to the name of the snapshot written at an out-of-memory error
ASCEND = "_ascend_pt"  # the end of torch_npu's folder name
OOM_WHEN = ("only if the process runs out of memory while this capture runs (at most one "
            "per capture)")
OOM_ALWAYS = ("; with history: always, an out-of-memory error at a step no capture records "
              "writes one too, named for that step")

_PLACEHOLDER = re.compile(r"<[^<>]*>")
_NSYS_TOKEN = re.compile(r"%(p|h|q\{([^}]*)\})")


def torch_extension(gzip: bool) -> str:
    """The ending of a torch trace."""
    return TORCH_GZIP if gzip else TORCH_PLAIN


def numbered_reports(settings: Mapping[str, Any]) -> bool:
    """Whether nsys numbers this process's reports (``X.1.nsys-rep``, ...): not when the
    launch stops at the end of the first range, or when the plan has one range."""
    return not (str(settings["capture_range_end"]).startswith("stop")
                or settings.get("planned_ranges") == 1)


def _ascend_folder(name: str) -> str:
    """torch_npu's folder for a cycle named ``name``, with its pid and time as
    placeholders; placeholders in ``name`` survive torch_npu's character rules."""
    from policy_engine.backends.mstx.session import worker_name

    sub, base = os.path.split(name)
    found = _PLACEHOLDER.findall(base)
    for i, text in enumerate(found):  # plain letters pass the sanitizer unchanged
        base = base.replace(text, f"PEHOLD{i}X", 1)
    worker = worker_name(base)
    for i, text in enumerate(found):
        worker = worker.replace(f"PEHOLD{i}X", text, 1)
    return os.path.join(sub, f"{worker}_<pid>_<npu_timestamp>{ASCEND}") + "/"


def _nsys_report(output: str, output_dir: str, index: int, numbered: bool) -> str:
    """nsys's report for capture range ``index``, relative to ``output_dir``, with the
    tokens nsys expands at launch as placeholders."""
    from policy_engine.backends.nsight.launch import report_path

    def token(match: re.Match[str]) -> str:
        if match.group(1) == "p":
            return "<pid>"
        if match.group(1) == "h":
            return "<host>"
        return f"<env:{match.group(2)}>"

    path = report_path(_NSYS_TOKEN.sub(token, output), index, numbered=numbered)
    return os.path.relpath(path, output_dir) if output_dir else path


def _file(path: str, backend: str, when: str | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"path": path, "backend": backend}
    if when is not None:
        found["when"] = when
    return found


def name_files(backend: str, settings: Mapping[str, Any], output_dir: str,
               name: str, index: int) -> list[dict[str, Any]]:
    """The files ``backend`` writes for the trace ``name``, the ``index``-th trace of its
    process (from 0), relative to ``output_dir``."""
    if backend == "torch":
        return [_file(name + torch_extension(bool(settings["gzip"])), backend)]
    if backend == "memory":
        snapshot = [_file(name + SNAPSHOT, backend)]
        if not settings.get("on_oom", True):
            return snapshot
        when = OOM_WHEN + (OOM_ALWAYS if settings.get("history") == "always" else "")
        return [*snapshot, _file(name + OOM + SNAPSHOT, backend, when)]
    if backend == "mstx":
        return [_file(_ascend_folder(name), backend)]
    if backend == "nsight":
        output = settings.get("output")
        if output is None:
            return [_file(name + ".nsys-rep", backend)]
        return [_file(_nsys_report(str(output), output_dir, index, numbered_reports(settings)),
                      backend)]
    return [_file(name, backend)]  # a backend this module does not know: its own ending
