"""The vllm backend: a rollout role whose work runs inside a vLLM engine."""
