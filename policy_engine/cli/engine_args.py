"""policy-engine engine-args FILE --role R: what to start a role's rollout engine with.

For a vllm role: vLLM's profiler configuration (``ProfilerConfig``), which vLLM reads only
at launch: ``vllm serve`` options (shell), ``LLM(profiler_config=...)`` (python), or data
(json). For an sglang role: the environment the SGLang engine starts with (its per-request
settings are sent by the driver). Either way the engine writes into the folder the driver
collects from, under the policy's output_dir.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

from policy_engine import settings as registry
from policy_engine.backends.engine.kind import staging_folder
from policy_engine.backends.sglang import checks as sglang
from policy_engine.backends.vllm import checks as vllm
from policy_engine.cli._common import (
    add_format_option,
    load_role_layout,
    policy_parser,
    print_json,
)
from policy_engine.cli.usage import UsageError
from policy_engine.language.model import Policy


def add_parser(sub: Any, name: str, help: str) -> None:
    parser = policy_parser(sub, name, help, __doc__, role={
        "default": "rollout", "help": "the engine's role (rollout)"})
    add_format_option(parser, "shell", "json", "python")
    parser.set_defaults(run=run, format="shell")


def build(policy: Policy, role: str) -> dict[str, Any]:
    """What the formats print, as data."""
    spec = policy.role(role)
    if spec.backend not in registry.ENGINES:
        raise UsageError(f"role {role!r} profiles with {spec.backend}, not an engine "
                         f"({', '.join(sorted(registry.ENGINES))})")
    settings = spec.settings
    mesh = dict(policy.mesh_for(role) or {})
    data: dict[str, Any] = {"role": role, "engine": spec.backend, "enabled": spec.enabled,
                            "mesh": mesh}
    if spec.backend == "vllm":
        folder = staging_folder(policy.output_dir, role, settings["torch_profiler_dir"])
        data["folder"] = folder
        data["profiler_config"] = vllm.launch_config(settings, spec.schedule, folder)
    else:
        folder = staging_folder(policy.output_dir, role, settings["output_dir"])
        data["folder"] = folder
        data["env"] = sglang.launch_env(settings, folder)
        data["request"] = sglang.start_kwargs(settings, spec.schedule, folder,
                                              "<prefix>", "<profile_id>")
    return data


def _value(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (list, dict, bool)) or value is None \
        else str(value)


def _shell(data: dict[str, Any]) -> str:
    lines = [f"# {data['engine']} engine of role {data['role']}: traces go to {data['folder']}"]
    if not data["enabled"]:
        lines.append("# the role is disabled: the engine needs no profiler")
    if data["engine"] == "vllm":
        lines.append("# vllm serve MODEL \\")
        options = [f"--profiler-config.{key}={_value(value)}"
                   for key, value in data["profiler_config"].items()]
        lines.append(" \\\n".join(f"  {shlex.quote(option)}" for option in options))
    else:
        lines += [f"export {key}={shlex.quote(value)}" for key, value in data["env"].items()]
    return "\n".join(lines) + "\n"


def _python(data: dict[str, Any]) -> str:
    if data["engine"] == "vllm":
        config = json.dumps(data["profiler_config"], indent=4)
        config = config.replace("true", "True").replace("false", "False")
        return (f"profiler_config = {config}\n"
                "# LLM(model, profiler_config=profiler_config), or "
                "AsyncEngineArgs(..., profiler_config=profiler_config)\n")
    env = json.dumps(data["env"], indent=4)
    return ("import os\n\n"
            f"os.environ.update({env})  # before sglang.Engine(...) or the server starts\n")


def run(args: argparse.Namespace) -> int:
    policy, _world = load_role_layout(args, "engine-args", assumed_world=1)
    data = build(policy, args.role)
    if args.world is None and not policy.mesh_for(args.role):
        print(f"policy-engine engine-args: note: role {args.role!r} has no mesh: one "
              f"{data['engine']} rank (tp=1) is assumed, as validate says; give the engine's "
              "parallelism as the role's mesh, e.g. tp: 4", file=sys.stderr)
    if args.format == "json":
        print_json(data)
    elif args.format == "python":
        sys.stdout.write(_python(data))
    else:
        sys.stdout.write(_shell(data))
    return 0
