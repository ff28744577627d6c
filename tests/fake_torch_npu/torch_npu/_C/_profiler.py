"""The fake of torch_npu's compiled ``_C._profiler``: only ProfilerActivity."""

import enum


class ProfilerActivity(enum.Enum):
    CPU = 0
    NPU = 1
