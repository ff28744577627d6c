"""The Ascend NPU profiler (``backend: mstx``, alias ``npu``): ``checks`` for validate, without
importing torch_npu; ``session`` drives ``torch_npu.profiler`` inside training."""
