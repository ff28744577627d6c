"""The sglang backend: a rollout role whose work runs inside an SGLang engine."""
