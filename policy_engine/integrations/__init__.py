"""Callbacks that profile a training framework's own loop under a policy.

    from policy_engine.integrations.lightning import PolicyCallback       # Lightning
    from policy_engine.integrations.transformers import PolicyCallback    # Hugging Face
    from policy_engine.integrations.engines import apply_policy           # vLLM, SGLang

Each module imports its framework when it is imported itself; ``import policy_engine``
imports neither. See docs/integrations.md.
"""
