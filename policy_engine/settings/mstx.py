"""The mstx backend's settings, value tables and validate-time checks, without importing
torch_npu.

:data:`SETTINGS` is the ``mstx:`` block of a role as a JSON Schema fragment, every setting
with its default; :func:`aic_metrics` resolves the one default that depends on another
setting. :func:`check_settings` finds contradictions in a block as torch_npu defines them;
:func:`check_runtime` finds what stops the backend on this machine, reading the installed
torch_npu's sources (:func:`source_params`, :func:`version_warnings`) and asking CANN's
msprof.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "ACTIVITIES",
    "AIC_METRICS",
    "CANN",
    "DOMAINS",
    "EMPTY",
    "EXPORT_TYPES",
    "FLAGS",
    "INSTALL",
    "LEVELS",
    "SETTINGS",
    "SOURCES",
    "Params",
    "aic_metrics",
    "as_list",
    "check_runtime",
    "check_settings",
    "source_params",
    "version_warnings",
]

# The value tables: policy value -> attribute of torch_npu's class, which holds torch_npu's
# own constant. The schema's enums below are read from them, so the two cannot differ.
LEVELS = {"level_none": "Level_none", "level0": "Level0", "level1": "Level1", "level2": "Level2"}
# fmt: off
AIC_METRICS = {
    "none": "AiCoreNone", "pipe_utilization": "PipeUtilization",
    "arithmetic_utilization": "ArithmeticUtilization", "memory": "Memory",
    "memory_l0": "MemoryL0", "memory_ub": "MemoryUB",
    "resource_conflict_ratio": "ResourceConflictRatio", "l2_cache": "L2Cache",
    "memory_access": "MemoryAccess",
}
# fmt: on
EXPORT_TYPES = {"text": "Text", "db": "Db"}
ACTIVITIES = {"cpu": "CPU", "npu": "NPU"}
#: Settings passed to torch_npu.profiler.profile() as they are.
FLAGS = ("record_shapes", "profile_memory", "with_stack", "with_modules", "with_flops")


def _flag(default: bool, meaning: str) -> dict[str, Any]:
    return {"type": "boolean", "default": default, "description": meaning}


def _domains(meaning: str) -> dict[str, Any]:
    return {
        "type": ["array", "null"],
        "uniqueItems": True,
        "items": {"type": "string", "minLength": 1},
        "default": None,
        "description": f"{meaning} (needs ranges: true; torch_npu >= 2.6). null: no filter.",
    }


#: The ``mstx:`` block of a role, as a JSON Schema fragment: every setting with its default.
SETTINGS: Mapping[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": "Ascend NPU profiler (torch_npu.profiler) settings; see docs/ascend.md.",
    "properties": {
        "level": {
            "enum": list(LEVELS),
            "default": "level1",
            "description": (
                "torch_npu ProfilerLevel: level_none (mstx ranges only), level0 "
                "(framework + NPU task timeline), level1 (adds CANN AscendCL data, "
                "AI Core metrics and HCCL ops), level2 (adds CANN runtime and AI "
                "CPU data)."
            ),
        },
        "activities": {
            "type": "array",
            "uniqueItems": True,
            "items": {"enum": list(ACTIVITIES)},
            "default": ["cpu", "npu"],
            "description": (
                "torch_npu ProfilerActivity values; an empty list is an error "
                "(torch_npu would read it as all)."
            ),
        },
        "record_shapes": _flag(False, "torch_npu.profiler.profile(record_shapes=)."),
        "profile_memory": _flag(False, "torch_npu.profiler.profile(profile_memory=)."),
        "with_stack": _flag(False, "torch_npu.profiler.profile(with_stack=)."),
        "with_modules": _flag(False, "torch_npu.profiler.profile(with_modules=)."),
        "with_flops": _flag(False, "torch_npu.profiler.profile(with_flops=)."),
        "analysis": _flag(
            False,
            "true: torch_npu parses the data when the cycle is saved "
            "(blocks training meanwhile); false: raw data only, run "
            "torch_npu.profiler.profiler.analyse(path) offline.",
        ),
        "export_type": {
            "oneOf": [
                {"enum": list(EXPORT_TYPES)},
                {
                    "type": "array",
                    "minItems": 1,
                    "uniqueItems": True,
                    "items": {"enum": list(EXPORT_TYPES)},
                },
            ],
            "default": "text",
            "description": (
                "torch_npu ExportType of the parsed output: text (json/csv), db "
                "(sqlite; needs a CANN whose msprof supports --type), or both."
            ),
        },
        "ranges": _flag(
            True,
            "mstx ranges: the _ExperimentalConfig mstx switch (msprof_tx "
            "before torch_npu 2.7) and the engine's regions as mstx ranges.",
        ),
        "domain": {
            "type": ["string", "null"],
            "minLength": 1,
            "default": None,
            "description": (
                "mstx domain of the engine's region ranges; null: torch_npu's "
                "default domain ('default'). Needs torch_npu >= 2.6."
            ),
        },
        "aic_metrics": {
            "oneOf": [
                {"enum": list(AIC_METRICS)},
                {"type": "null"},
            ],
            "default": None,
            "description": (
                "torch_npu AiCMetrics; only with level1 or level2. null: torch_npu's "
                "own for the level (pipe_utilization at level1 and level2, none "
                "below)."
            ),
        },
        "l2_cache": _flag(False, "_ExperimentalConfig(l2_cache=): collect L2 cache data."),
        "data_simplification": _flag(
            True, "_ExperimentalConfig(data_simplification=): drop intermediate data after parsing."
        ),
        "record_op_args": _flag(
            False, "_ExperimentalConfig(record_op_args=): dump operator arguments (for AOE tuning)."
        ),
        "mstx_domain_include": _domains(
            "Collect only these mstx domains; not with mstx_domain_exclude"
        ),
        "mstx_domain_exclude": _domains("Collect every mstx domain but these"),
    },
}
_LEVELS_WITHOUT_AIC = ("level0", "level_none")


def aic_metrics(settings: Mapping[str, Any]) -> str:
    """The AI Core metrics a capture asks torch_npu for: ``aic_metrics``, or where it is
    null torch_npu's own for the level (pipe_utilization at level1 and level2, none below,
    where torch_npu would reset any other to none)."""
    if settings["level"] in _LEVELS_WITHOUT_AIC:
        return "none"
    chosen: str | None = settings["aic_metrics"]
    return chosen if chosen is not None else "pipe_utilization"


EMPTY = "activities is empty: list at least one of cpu, npu (an empty list never means all)"
CANN = "it needs the Ascend CANN toolkit installed and its set_env.sh sourced"
INSTALL = (
    f"torch_npu is not installed: `pip install torch_npu` (the release matching torch); {CANN}"
)
DOMAINS = ("mstx_domain_include", "mstx_domain_exclude")
_RESETS = "torch_npu resets it to none"
_KEEPS = "torch_npu keeps only the include list"
# (setting, torch_npu callable, keyword it needs there), for version_warnings.
_NEEDS = (
    ("ranges", "_ExperimentalConfig", "mstx"),
    *((k, "_ExperimentalConfig", k) for k in ("l2_cache", "data_simplification", "record_op_args")),
    *((k, "_ExperimentalConfig", k) for k in DOMAINS),
    ("with_flops", "profile", "with_flops"),
    ("domain", "range_start", "domain"),  # range_end takes domain in the same releases
)
# Where each checked callable is defined in the torch_npu package: file, class, function.
SOURCES = {
    "_ExperimentalConfig": ("profiler/experimental_config.py", "_ExperimentalConfig", "__init__"),
    "profile": ("profiler/profiler.py", "profile", "__init__"),
    "tensorboard_trace_handler": ("profiler/profiler.py", None, "tensorboard_trace_handler"),
    "range_start": ("npu/mstx.py", "mstx", "range_start"),
    "range_end": ("npu/mstx.py", "mstx", "range_end"),
}
Params = Mapping[str, "frozenset[str] | None"]  # keywords per callable; None = unknown, allow all


def as_list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else [str(v) for v in value or ()]


def _problems(s: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    acts, level = list(s["activities"]), s["level"]
    ranges, aic, domain = bool(s["ranges"]), s["aic_metrics"], s["domain"]
    include, exclude = (list(s[key] or ()) for key in DOMAINS)
    if not acts:
        yield "activities", EMPTY
    if aic not in (None, "none") and level in _LEVELS_WITHOUT_AIC:
        yield "aic_metrics", f"aic_metrics {aic!r} needs level1 or level2 ({_RESETS} at {level})"
    if level == "level_none" and not ranges:
        yield "ranges", "level_none records only mstx ranges: set ranges: true"
    if include and exclude:
        yield DOMAINS[1], f"{DOMAINS[1]} cannot be set with {DOMAINS[0]} ({_KEEPS})"
    for key in DOMAINS if not ranges else ():
        if s[key]:
            yield key, f"{key} needs ranges: true (torch_npu ignores it while mstx is off)"
    if domain and ranges and ((include and domain not in include) or domain in exclude):
        yield "domain", f"domain {domain!r} is filtered out by the mstx_domain_* lists"
    for key in ("aic_metrics", "l2_cache", "record_op_args") if acts and "npu" not in acts else ():
        if s[key] not in (None, False, "none"):
            yield key, f"{key} needs npu in activities (torch_npu ignores it without NPU)"


def check_settings(settings: Mapping[str, Any]) -> list[tuple[str, tuple[str | int, ...]]]:
    """Contradictions in an ``mstx:`` block (merged over its defaults) the schema cannot
    see, as torch_npu defines them."""
    return [(message, (key,)) for key, message in _problems(settings)]


def version_warnings(settings: Mapping[str, Any], params: Params, version: str) -> list[str]:
    """One message per setting in use that the installed torch_npu has no keyword for."""
    out = []
    for key, target, keyword in _NEEDS:
        known = params.get(target)
        value = settings[key]
        # data_simplification defaults to True in torch_npu; only False asks for something.
        asks = value is False if key == "data_simplification" else bool(value)
        if known is None or keyword in known or not asks:
            continue
        if keyword == "mstx" and "msprof_tx" in known:
            continue  # torch_npu < 2.7 names the same switch msprof_tx: used, nothing lost
        if keyword == "domain" and not settings["ranges"]:
            continue
        out.append(
            f"torch_npu {version} has no '{keyword}' argument in {target}: mstx.{key} is "
            "ignored there (a newer torch_npu supports it)"
        )
    return list(dict.fromkeys(out))


def source_params(root: Path) -> dict[str, frozenset[str] | None]:
    """Keywords of each callable in :data:`SOURCES`, read from torch_npu's files with ``ast``."""
    import ast  # validate --check-runtime only

    out: dict[str, frozenset[str] | None] = {}
    for name, (rel, cls, fn) in SOURCES.items():
        try:
            body = ast.parse((root / rel).read_text(encoding="utf-8")).body
        except (OSError, SyntaxError, ValueError):
            out[name] = None
            continue
        if cls is not None:
            body = next((n.body for n in body if isinstance(n, ast.ClassDef) and n.name == cls), [])
        node = next((n for n in body if isinstance(n, ast.FunctionDef) and n.name == fn), None)
        args = None if node is None or node.args.kwarg else node.args
        out[name] = (
            None
            if args is None
            else frozenset(a.arg for a in (*args.args, *args.kwonlyargs) if a.arg != "self")
        )
    return out


def _db_problem() -> str | None:
    # torch_npu's analysis raises unless `msprof --help` lists --type (CANN that can export db).
    import shutil
    import subprocess

    msprof = shutil.which("msprof")
    if msprof is None:
        return "export_type db needs CANN's msprof on PATH (torch_npu asks it about db export)"
    try:
        text = subprocess.run([msprof, "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"export_type db: `msprof --help` failed ({exc})"
    return None if "--type" in text else "export_type db: this CANN's msprof cannot export db"


def check_runtime(settings: Mapping[str, Any]) -> list[str]:
    """What stops the backend here (or drops a setting), found without importing torch_npu."""
    spec = importlib.util.find_spec("torch_npu")  # a top-level find_spec imports nothing
    if spec is None:
        return [INSTALL]
    out = []
    if not (os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME")):
        out.append(
            "the Ascend CANN environment is not set (no ASCEND_HOME_PATH): source "
            "<CANN>/set_env.sh before training, or importing torch_npu fails"
        )
    for root in map(Path, spec.submodule_search_locations or ()):
        try:
            found = re.search(
                r"__version__\s*=\s*['\"]([^'\"]+)", (root / "version.py").read_text()
            )
        except OSError:
            found = None
        out += version_warnings(settings, source_params(root), found[1] if found else "?")
    if "db" in as_list(settings["export_type"]) and (problem := _db_problem()):
        out.append(problem)
    return out
