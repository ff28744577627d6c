"""What a vLLM engine object was launched with, against the policy: its profiler settings
are fixed at launch, so the driver can only say which differ."""

from __future__ import annotations

import os
from typing import Any

from policy_engine.backends.engine.kind import staging_folder
from policy_engine.backends.vllm.checks import launch_config
from policy_engine.runtime.process.state import warn_once

__all__ = ["check_launch"]


def check_launch(engine: Any, spec: Any, output_dir: str, role: str) -> str | None:
    """Warn when a vLLM engine object was launched with profiler settings other than the
    policy's: they are fixed at launch (``AsyncLLM.vllm_config``,
    ``LLM.llm_engine.vllm_config``); a server's cannot be read from here. Returns the
    profiler folder it was launched with when that is not the policy's (said at the first
    start by the driver), else None."""
    holder = getattr(engine, "vllm_config", None) or getattr(
        getattr(engine, "llm_engine", None), "vllm_config", None)
    config = getattr(holder, "profiler_config", None)
    if config is None:
        return None
    folder = staging_folder(output_dir, role, spec.settings["torch_profiler_dir"])
    wanted = launch_config(spec.settings, spec.schedule, folder)
    launched = getattr(config, "torch_profiler_dir", None)
    elsewhere = launched if isinstance(launched, str) and launched and \
        os.path.abspath(launched) != os.path.abspath(folder) else None
    differ = [f"{key}={getattr(config, key, None)!r} (the policy: {value!r})"
              for key, value in wanted.items()
              if key != "torch_profiler_dir" and getattr(config, key, value) != value]
    if differ:
        warn_once(("vllm-launch", role, tuple(differ)),
                  "policy-engine: role %r: the vLLM engine was launched with %s; these are "
                  "fixed at launch: restart it with what `policy-engine engine-args` prints",
                  role, "; ".join(differ))
    return elsewhere
