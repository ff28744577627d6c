"""Callbacks that profile a training framework's own loop under a policy.

    from policy_engine.integrations.lightning import PolicyCallback       # Lightning
    from policy_engine.integrations.transformers import PolicyCallback    # Hugging Face
    from policy_engine.integrations.engines import apply_engine_policy    # vLLM, SGLang

verl needs no import: ``policy_engine.integrations.verl`` is a ``verl.plugins`` entry point
that ``import verl`` loads, and that acts only when ``PROFILE_POLICY`` is set (docs/verl.md).

Each module imports its framework when it is imported itself; ``import policy_engine``
imports neither. See docs/integrations.md.
"""
