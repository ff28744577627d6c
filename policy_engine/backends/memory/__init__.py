"""The memory backend: CUDA (or Ascend NPU) allocator history, dumped as snapshots."""
