"""The fake ``_ExperimentalConfig`` and its constant classes, with torch_npu's values.

Like the real one it never raises on a bad value: it reports it (``torch_npu._fake.warn``)
and resets it, so tests can show that the engine notices.
"""

from __future__ import annotations

from typing import Any

from .._fake import record, warn

__all__ = [
    "AiCMetrics",
    "ExportType",
    "HostSystem",
    "ProfilerLevel",
    "_ExperimentalConfig",
    "supported_ai_core_metrics",
    "supported_export_type",
    "supported_profiler_level",
]


class ProfilerLevel:
    Level0 = "Level0"
    Level1 = "Level1"
    Level2 = "Level2"
    Level_none = "Level_none"


class AiCMetrics:
    PipeUtilization = "ACL_AICORE_PIPE_UTILIZATION"
    ArithmeticUtilization = "ACL_AICORE_ARITHMETIC_UTILIZATION"
    Memory = "ACL_AICORE_MEMORY_BANDWIDTH"
    MemoryL0 = "ACL_AICORE_L0B_AND_WIDTH"
    MemoryUB = "ACL_AICORE_MEMORY_UB"
    ResourceConflictRatio = "ACL_AICORE_RESOURCE_CONFLICT_RATIO"
    L2Cache = "ACL_AICORE_L2_CACHE"
    MemoryAccess = "ACL_AICORE_MEMORY_ACCESS"
    AiCoreNone = "ACL_AICORE_NONE"


class ExportType:
    Db = "db"
    Text = "text"


class HostSystem:
    CPU = "cpu"
    MEM = "mem"
    DISK = "disk"
    NETWORK = "network"
    OSRT = "osrt"
    NUMA = "numa"


def _public(cls: type) -> set[Any]:
    return {v for k, v in vars(cls).items() if not k.startswith("_")}


def supported_profiler_level() -> set[Any]:
    return _public(ProfilerLevel)


def supported_ai_core_metrics() -> set[Any]:
    return _public(AiCMetrics)


def supported_export_type() -> set[Any]:
    return _public(ExportType)


def _export_list(export_type: Any) -> list[Any]:
    if isinstance(export_type, str) and export_type:
        chosen = [export_type]
    elif isinstance(export_type, list) and export_type:
        chosen = list(dict.fromkeys(export_type))
    else:
        warn(f"Invalid parameter export_type: {export_type}, reset it to text.")
        return [ExportType.Text]
    if not set(chosen) <= supported_export_type():
        warn("Invalid parameter export_type, reset it to text.")
        return [ExportType.Text]
    return chosen


def _bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    warn(f"Invalid parameter {name}, which must be of bool type, reset it to False.")
    return False


class _ExperimentalConfig213:
    """torch_npu 2.13.0's keywords and defaults; the checks the engine must pre-empt."""

    def __init__(
        self,
        profiler_level: Any = ProfilerLevel.Level0,
        aic_metrics: Any = AiCMetrics.PipeUtilization,
        l2_cache: bool = False,
        msprof_tx: bool = False,
        mstx: bool = False,
        data_simplification: bool = True,
        record_op_args: bool = False,
        op_attr: bool = False,
        gc_detect_threshold: float | None = None,
        export_type: Any = ExportType.Text,
        host_sys: list[Any] | None = None,
        mstx_domain_include: list[str] | None = None,
        mstx_domain_exclude: list[str] | None = None,
        sys_io: bool = False,
        sys_interconnection: bool = False,
    ) -> None:
        record("_ExperimentalConfig", {k: v for k, v in locals().items() if k != "self"})
        if profiler_level not in supported_profiler_level():
            warn("Invalid parameter profiler_level, reset it to ProfilerLevel.Level0.")
            profiler_level = ProfilerLevel.Level0
        low = profiler_level in (ProfilerLevel.Level0, ProfilerLevel.Level_none)
        if aic_metrics not in supported_ai_core_metrics():
            warn("Invalid parameter aic_metrics, reset it to default.")
            aic_metrics = AiCMetrics.AiCoreNone if low else AiCMetrics.PipeUtilization
        if low and aic_metrics != AiCMetrics.AiCoreNone:
            warn("Please use level1 or level2 if you want to collect aic metrics, reset to None!")
            aic_metrics = AiCMetrics.AiCoreNone
        self._profiler_level = profiler_level
        self._aic_metrics = aic_metrics
        self._l2_cache = _bool(l2_cache, "l2_cache")
        self._msprof_tx = _bool(msprof_tx, "msprof_tx")
        self._mstx = _bool(mstx, "mstx")
        if profiler_level == ProfilerLevel.Level_none and not (self._mstx or self._msprof_tx):
            warn("Parameter mstx or msprof_tx must be True if profiler_level is set to Level_none.")
            self._mstx = True
        self._data_simplification = data_simplification
        self.record_op_args = _bool(record_op_args, "record_op_args")
        self._op_attr = op_attr
        self._gc_detect_threshold = gc_detect_threshold
        self._export_type = _export_list(export_type)
        self._host_sys = list(host_sys or [])
        self._sys_io = sys_io
        self._sys_interconnection = sys_interconnection
        include, exclude = list(mstx_domain_include or []), list(mstx_domain_exclude or [])
        if not self.tx_enabled:
            if include or exclude:
                warn("mstx_domain_include and mstx_domain_exclude are valid when mstx is True.")
            include, exclude = [], []
        if include and exclude:
            warn("mstx_domain_include and mstx_domain_exclude can not be both set.")
            exclude = []
        self._mstx_domain_include, self._mstx_domain_exclude = include, exclude

    @property
    def export_type(self) -> list[Any]:
        return self._export_type

    @property
    def tx_enabled(self) -> bool:
        return self._msprof_tx or self._mstx


class _ExperimentalConfig251:
    """torch_npu 2.5.1's keywords: no mstx (msprof_tx only), no domain filters."""

    def __init__(
        self,
        profiler_level: Any = ProfilerLevel.Level0,
        aic_metrics: Any = AiCMetrics.AiCoreNone,
        l2_cache: bool = False,
        msprof_tx: bool = False,
        data_simplification: bool = True,
        record_op_args: bool = False,
        op_attr: bool = False,
        gc_detect_threshold: float | None = None,
        export_type: Any = None,
    ) -> None:
        record("_ExperimentalConfig", {k: v for k, v in locals().items() if k != "self"})
        low = profiler_level in (ProfilerLevel.Level0, ProfilerLevel.Level_none)
        if not low and aic_metrics == AiCMetrics.AiCoreNone:
            aic_metrics = AiCMetrics.PipeUtilization  # 2.5.1 does this without a word
        if low and aic_metrics != AiCMetrics.AiCoreNone:
            warn("Please use level1 or level2 if you want to collect aic metrics, reset to None!")
            aic_metrics = AiCMetrics.AiCoreNone
        self._profiler_level = profiler_level
        self._aic_metrics = aic_metrics
        self._l2_cache = _bool(l2_cache, "l2_cache")
        self._msprof_tx = _bool(msprof_tx, "msprof_tx")
        self._data_simplification = data_simplification
        self.record_op_args = _bool(record_op_args, "record_op_args")
        self._op_attr = op_attr
        self._gc_detect_threshold = gc_detect_threshold
        self._export_type = _export_list(export_type)

    @property
    def export_type(self) -> list[Any]:
        return self._export_type


_ExperimentalConfig: type = _ExperimentalConfig213
