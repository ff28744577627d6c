"""What the rollout-engine backends (vllm, sglang) share: the engines' file names, finding
and publishing the files an engine wrote, and calling an engine's profiler bounded by a
timeout."""
