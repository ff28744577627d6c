"""The fake ``torch_npu.profiler``: the names the real package exports."""

from .._C._profiler import ProfilerActivity
from .experimental_config import (
    AiCMetrics,
    ExportType,
    HostSystem,
    ProfilerLevel,
    _ExperimentalConfig,
    supported_ai_core_metrics,
    supported_export_type,
    supported_profiler_level,
)
from .profiler import profile, supported_activities, tensorboard_trace_handler
from .scheduler import ProfilerAction
from .scheduler import Schedule as schedule

__all__ = [
    "AiCMetrics",
    "ExportType",
    "HostSystem",
    "ProfilerAction",
    "ProfilerActivity",
    "ProfilerLevel",
    "_ExperimentalConfig",
    "profile",
    "schedule",
    "supported_activities",
    "supported_ai_core_metrics",
    "supported_export_type",
    "supported_profiler_level",
    "tensorboard_trace_handler",
]
