"""The names vLLM and SGLang give their profiler files, read back into engine coordinates,
and the move of each file into the policy's per-window layout.

Read from the engines' sources (tests/test_engines_contract.py keeps these true):

* vLLM 0.33.0: a worker's trace is torch's ``tensorboard_trace_handler`` file for the
  worker name ``{prefix}_{suffix}`` (``vllm/v1/worker/gpu_worker.py``), the suffix from
  ``get_worker_rank_suffix`` (``vllm/distributed/utils.py``):
  ``{prefix}_dp{dp}_pp{pp}_tp{tp}_dcp{dcp}_ep{ep}_rank{global}.{time_ns}.pt.trace.json[.gz]``;
  ``AsyncLLM``'s front end writes ``{prefix}_{host}_{pid}.async_llm.{time_ns}.pt.trace...``.
* SGLang 0.5.23 (``scheduler_components/profiler_manager.py``):
  ``[{prefix}-]{profile_id}-TP-{tp}[-DP-{dp}][-PP-{pp}][-EP-{ep}][-{STAGE}].trace.json.gz``
  (DP, PP and EP only when that size is above 1; STAGE EXTEND or DECODE with
  ``profile_by_stage``), and memory snapshots
  ``[{prefix}-]{time}-TP-{tp}-memory[-{STAGE}].pickle``.

Every capture passes its own prefix (and SGLang profile id), so only that capture's files
match, whatever else the folder holds.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping

import attrs

from policy_engine.files.publish import moved_from, write_atomic
from policy_engine.settings.sglang import STAGES as STAGES

_UNSAFE = re.compile(r"[^A-Za-z0-9.-]+")

_VLLM_WORKER = re.compile(
    r"_dp(?P<dp>\d+)_pp(?P<pp>\d+)_tp(?P<tp>\d+)_dcp(?P<dcp>\d+)_ep(?P<ep>\d+)"
    r"_rank(?P<rank>\d+)\.(?P<ns>\d+)\.pt\.trace\.json(?P<gz>\.gz)?")
_VLLM_FRONTEND = re.compile(r"_(?P<host>.+)_(?P<pid>\d+)\.async_llm\.(?P<ns>\d+)"
                            r"\.pt\.trace\.json(?P<gz>\.gz)?")
_SGLANG_TRACE = re.compile(
    r"-TP-(?P<tp>\d+)(?:-DP-(?P<dp>\d+))?(?:-PP-(?P<pp>\d+))?(?:-EP-(?P<ep>\d+))?"
    r"(?:-(?P<stage>EXTEND|DECODE))?\.trace\.json\.gz")
_SGLANG_MEMORY = re.compile(r"-(?P<time>[0-9.]+)-TP-(?P<tp>\d+)-memory"
                            r"(?:-(?P<stage>EXTEND|DECODE))?\.pickle")


@attrs.frozen
class EngineFile:
    """One file an engine wrote for a capture."""

    path: str
    #: the engine's coordinates as its name gives them (tp, pp, dp, ep; vLLM adds dcp and
    #: its global ``rank``); a dimension the name leaves out is absent
    coords: Mapping[str, int]
    #: trace (a rank's Chrome trace), memory (an SGLang memory snapshot), frontend (vLLM
    #: AsyncLLM's CPU trace, which belongs to no rank)
    kind: str = "trace"
    #: extend or decode (SGLang ``profile_by_stage``)
    stage: str | None = None

    @property
    def extension(self) -> str:
        """What the published copy ends with."""
        if self.kind == "memory":
            return ".pickle"
        return ".pt.trace.json.gz" if self.path.endswith(".gz") else ".pt.trace.json"


def capture_prefix(role: str, step: int | None, replica: int, token: str) -> str:
    """The prefix a capture gives the engine: role, step, replica and a token of the
    capture, so no two replicas or captures share a file name (vLLM's and SGLang's
    default names collide across replicas that share a folder). Never holds ``_``: vLLM
    joins its own fields with it. What vLLM's ``validate_profile_prefix`` accepts: a
    letter or digit, then letters, digits, ``.``, ``_`` and ``-``, 128 at most
    (tests/test_engines_validate.py holds it to that)."""
    parts = ["pe", role, "session" if step is None else f"step{step}", f"dp{replica}", token]
    text = "-".join(_UNSAFE.sub("-", p).strip("-") or "x" for p in parts)
    return text[:128]


def parse_vllm(name: str, prefix: str) -> EngineFile | None:
    """The file ``name`` if a vLLM worker or front end wrote it for ``prefix``."""
    if not name.startswith(prefix):
        return None
    rest = name[len(prefix):]
    found = _VLLM_WORKER.fullmatch(rest)
    if found is not None:
        coords = {k: int(found[k]) for k in ("dp", "pp", "tp", "dcp", "ep", "rank")}
        return EngineFile(name, coords)
    if _VLLM_FRONTEND.fullmatch(rest) is not None:
        return EngineFile(name, {}, "frontend")
    return None


def parse_sglang(name: str, prefix: str, profile_id: str) -> EngineFile | None:
    """The file ``name`` if an SGLang scheduler wrote it for ``prefix`` and ``profile_id``
    (memory snapshots carry a time of their own instead of the profile id)."""
    head = prefix + "-"
    if not name.startswith(head):
        return None
    rest = name[len(head):]
    if rest.startswith(profile_id):
        found = _SGLANG_TRACE.fullmatch(rest[len(profile_id):])
        if found is not None:
            coords = {k: int(v) for k, v in found.groupdict().items()
                      if k != "stage" and v is not None}
            stage = found["stage"].lower() if found["stage"] else None
            return EngineFile(name, coords, "trace", stage)
    memory = _SGLANG_MEMORY.fullmatch("-" + rest)
    if memory is not None:
        stage = memory["stage"].lower() if memory["stage"] else None
        return EngineFile(name, {"tp": int(memory["tp"])}, "memory", stage)
    return None


Parser = Callable[[str], "EngineFile | None"]


def find(folder: str, parse: Parser) -> list[EngineFile]:
    """The files in ``folder`` that ``parse`` recognises, with their full paths, sorted."""
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        found = parse(name)
        if found is not None and os.path.isfile(os.path.join(folder, name)):
            out.append(attrs.evolve(found, path=os.path.join(folder, name)))
    return out


def _sizes(files: list[EngineFile]) -> list[int]:
    sizes = []
    for f in files:
        try:
            sizes.append(os.path.getsize(f.path))
        except OSError:
            sizes.append(-1)
    return sizes


def wait_for(folder: str, parse: Parser, expected: int, timeout: float,
             poll: float = 0.2) -> list[EngineFile]:
    """The capture's files once ``expected`` of them are there and their sizes held still
    for one poll (a remote engine may still be writing when its stop returned), or what
    is there when ``timeout`` runs out."""
    deadline = time.monotonic() + timeout
    last: list[int] | None = None
    while True:
        files = find(folder, parse)
        sizes = _sizes(files)
        if len(files) >= expected and sizes == last and all(s > 0 for s in sizes):
            return files
        if time.monotonic() >= deadline:
            return files
        last = sizes
        time.sleep(poll)


def publish(src: str, output_dir: str, stem: str, ext: str) -> tuple[str, int]:
    """Move the engine's file ``src`` to ``output_dir/stem+ext`` (published whole, never
    over another file); its path and size."""
    return write_atomic(output_dir, stem, ext, moved_from(src))
