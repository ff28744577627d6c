"""The policy schema's own part: the top-level keys and a role's keys, each with its
``default`` and description. :mod:`policy_engine.language.schema.build` adds each backend's
settings block from the registry (and the ``backend`` enum) to make the full schema.

The dimension names come from the rank selector and the mesh, and the schedule's fields
from :class:`~policy_engine.language.values.schedule.Schedule`, so they cannot drift apart.
"""

from __future__ import annotations

from typing import Any

import attrs

from policy_engine.language.values.mesh import DIMS
from policy_engine.language.values.ranks import DIMENSIONS
from policy_engine.language.values.schedule import Schedule
from policy_engine.language.values.triggers import limits_schema, triggers_schema

ROLE_NAME = "^[A-Za-z][A-Za-z0-9_.+-]*$"
REGION_NAME = "^[A-Za-z_][A-Za-z0-9_]*$"
#: Mesh dimensions as a mesh is usually written, outermost first.
MESH_ORDER = ("pp", "dp", "cp", "ep", "tp")
assert set(MESH_ORDER) == set(DIMS)

_SCHEDULE_FIELDS = {
    "skip_first": "Inner steps ignored before the first cycle.",
    "skip_first_wait": "Non-zero (or true): drop the wait phase of the first cycle.",
    "wait": "Steps of each cycle with the profiler off.",
    "warmup": "Steps with the profiler on but its results thrown away.",
    "active": "Steps recorded in each cycle; the last one saves the trace.",
    "repeat": "Number of cycles; 0 repeats until the capture ends.",
}
_AXIS = (
    "An int (negative counts from the end), a range string like '0-3', 'all', or a list "
    "of ints and range strings."
)


def _schedule() -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for field in attrs.fields(Schedule):
        if not field.init:
            continue
        kind: Any = ["integer", "boolean"] if field.name == "skip_first_wait" else "integer"
        entry = {"type": kind, "minimum": field.metadata["minimum"]}
        if field.name != "active":  # required: it has no default in a policy
            entry["default"] = field.default
        properties[field.name] = {**entry, "description": _SCHEDULE_FIELDS[field.name]}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["active"],
        "description": "torch.profiler.schedule over inner steps (prof.step() calls).",
        "properties": properties,
    }


def _mesh(description: str, **extra: Any) -> dict[str, Any]:
    """A mesh: the top-level one, and a role's own (the same form)."""
    return {
        "type": "object",
        "description": description,
        "propertyNames": {"enum": list(MESH_ORDER)},
        "additionalProperties": {"type": "integer", "minimum": 1},
        **extra,
        "examples": [{"pp": 2, "dp": 2, "tp": 2}, {"dp": 8}, {"dp": 4, "tp": 2}],
    }


def _periodic() -> dict[str, Any]:
    """The keys of periodic steps, ``{every: 100, from: 100, until: 1000}``."""
    return {
        "properties": {
            "every": {"type": "integer", "minimum": 1,
                      "description": "Profile every N-th outer step."},
            "from": {"type": "integer", "minimum": 0,
                     "description": "The first profiled step; defaults to every (N, 2N, ...)."},
            "until": {"type": "integer", "minimum": 0,
                      "description": "The last step that may be profiled (inclusive); "
                                     "none: the steps never end."},
        },
        "required": ["every"],
        "additionalProperties": False,
    }


def _axes() -> dict[str, Any]:
    return {
        dim: {
            "type": ["integer", "string", "array"],
            "items": {"type": ["integer", "string"]},
            "description": _AXIS,
        }
        for dim in DIMENSIONS
    }


def base_schema() -> dict[str, Any]:
    """The schema without the backends (a new dict each call)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://policy-engine.dev/schemas/profile_policy.schema.json",
        "title": "policy-engine profile policy",
        "description": (
            "Which roles, ranks and steps of a distributed PyTorch job are "
            "profiled, with which backend, and how traces are named."
        ),
        "type": "object",
        "required": ["version"],
        "additionalProperties": False,
        "properties": {
            "$schema": {"type": "string", "description": "For editors; the engine ignores it."},
            "version": {"const": 1, "description": "Policy language version."},
            "extends": {
                "description": "Policy file(s) this one builds on, relative to this file.",
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "items": {"type": "string", "minLength": 1}},
                ],
            },
            "prefix": {
                "type": "string",
                "default": "trace",
                "description": "Label used by the <prefix> name field.",
                "examples": ["ppo-qwen7b"],
            },
            "output_dir": {
                "type": "string",
                "minLength": 1,
                "default": "profiles",
                "description": (
                    "Folder for traces and manifests, relative to the policy "
                    "file's folder unless absolute."
                ),
                "examples": ["profiles", "/shared/profiles/exp42"],
            },
            "mesh": _mesh("Parallel dimensions, outermost first; the last varies fastest. "
                          "Every role's mesh unless it gives its own."),
            "defaults": {
                "$ref": "#/$defs/role",
                "description": "Merged under every role (maps merge, lists replace).",
            },
            "roles": {
                "type": "object",
                "description": "Each role's block, merged over defaults.",
                "propertyNames": {"pattern": ROLE_NAME},
                "additionalProperties": {"$ref": "#/$defs/role"},
            },
            "colocate": {
                "type": "array",
                "description": (
                    "Groups of roles that share a process (verl's colocated actor, "
                    "ref and rollout). Roles of a group on one backend share one "
                    "capture per step; validate checks that they can, explain names "
                    "their shared traces with every participating role joined by "
                    "'+'."
                ),
                "items": {
                    "type": "array",
                    "minItems": 2,
                    "uniqueItems": True,
                    "items": {"type": "string", "pattern": ROLE_NAME},
                },
            },
        },
        "$defs": {
            "schedule": _schedule(),
            "triggers": triggers_schema(),
            "export": {
                "type": "object",
                "additionalProperties": False,
                "description": "How saved captures are written (docs/runtime.md, Export).",
                "properties": {
                    "mode": {"enum": ["background", "sync"], "default": "background",
                             "description": "background: serialise, compress and publish "
                                            "traces on a thread of their own, so the "
                                            "training step returns once the profiler has "
                                            "stopped; sync: on the training thread."},
                    "in_flight": {"type": "integer", "minimum": 1, "default": 2,
                                  "description": "Exports queued or running at most; the "
                                                 "training thread waits for room."},
                },
            },
            "limits": limits_schema(),
            "schedule_or_none": {"oneOf": [{"$ref": "#/$defs/schedule"}, {"type": "null"}]},
            "steps": {
                "description": (
                    "Outer training steps: 'all', an int, periodic steps {every: 100, "
                    "from: 100} (optional until), or a list of ints, ranges like '10-12' "
                    "or '100-2100:1000' and periodic steps."
                ),
                "type": ["integer", "string", "array", "object"],
                **_periodic(),
                "items": {"type": ["integer", "string", "object"], **_periodic()},
            },
            "rank_item": {
                "type": ["integer", "string", "object"],
                "properties": _axes(),
                "additionalProperties": False,
                "minProperties": 1,
            },
            "ranks": {
                "description": (
                    "Which ranks of the role profile: 'all', an int (negative "
                    "counts from the end), a string of ranges like '0-3,8,-1', a "
                    "mapping of coordinates (tp, pp, dp, cp, ep, local_rank, node) "
                    "that must all match, or a list of these (union)."
                ),
                "type": ["integer", "string", "object", "array"],
                "properties": _axes(),
                "additionalProperties": False,
                "minProperties": 1,
                "items": {"$ref": "#/$defs/rank_item"},
            },
            "region": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "enabled": {
                        "type": "boolean",
                        "default": True,
                        "description": "false: listed but not wrapped.",
                    },
                    "schedule": {
                        "$ref": "#/$defs/schedule_or_none",
                        "description": (
                            "The region's own schedule (discrete mode only); absent: the role's."
                        ),
                    },
                },
            },
            "role": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "enabled": {
                        "type": "boolean",
                        "default": False,
                        "description": "Whether the role profiles at all.",
                    },
                    "backend": {
                        # the registry fills both enums
                        "oneOf": [
                            {"enum": []},
                            {"type": "array", "minItems": 1, "uniqueItems": True,
                             "items": {"enum": []}},
                        ],
                        "default": "torch",
                        "description": (
                            "The profiling tool, or a list of tools that record the same "
                            "captures: one of torch, mstx, nsight, with memory (CUDA or NPU "
                            "allocator history) beside it, e.g. [torch, memory]."
                        ),
                        "examples": ["torch", ["torch", "memory"], "nsight"],
                    },
                    "ranks": {
                        "$ref": "#/$defs/ranks",
                        "default": [0],
                        "description": "Which processes of the role profile.",
                        "examples": [[0, -1], "all", "0-3,-1", {"tp": 0},
                                     {"tp": 0, "dp": [0, -1]}, [0, {"pp": -1, "tp": 0}]],
                    },
                    "steps": {
                        "$ref": "#/$defs/steps",
                        "default": "all",
                        "description": (
                            "Which outer training steps (training_step(n)) are captured."
                        ),
                        "examples": [[2, 3], "10-12", "100-2100:1000", [5, "10-12"],
                                     {"every": 100, "from": 100}, "all"],
                    },
                    "merge_steps": {
                        "type": "boolean",
                        "default": False,
                        "description": "Consecutive profiled steps form one capture.",
                    },
                    "schedule": {
                        "$ref": "#/$defs/schedule_or_none",
                        "default": None,
                        "description": (
                            "What happens at each inner step (prof.step()) "
                            "within a capture; null records the whole "
                            "capture."
                        ),
                        "examples": [{"wait": 0, "warmup": 1, "active": 2, "repeat": 1},
                                     {"skip_first": 2, "wait": 1, "warmup": 1, "active": 3,
                                      "repeat": 1}],
                    },
                    "discrete": {
                        "type": "boolean",
                        "default": False,
                        "description": "true: each region call is its own capture.",
                    },
                    "regions": {
                        "description": (
                            "Named stages of the worker: method names, or a "
                            "mapping name -> {enabled, schedule}."
                        ),
                        "default": [],
                        "examples": [["update_actor", "compute_log_prob"],
                                     {"generate_sequences": {"enabled": True},
                                      "compute_values": {"enabled": False}}],
                        "oneOf": [
                            {
                                "type": "array",
                                "uniqueItems": True,
                                "items": {"type": "string", "pattern": REGION_NAME},
                            },
                            {
                                "type": "object",
                                "propertyNames": {"pattern": REGION_NAME},
                                "additionalProperties": {
                                    "oneOf": [{"$ref": "#/$defs/region"}, {"type": "null"}]
                                },
                            },
                        ],
                    },
                    "name": {
                        "type": "string",
                        "minLength": 1,
                        "default": (
                            "<role>[/<region>][/step<step>][/cycle<cycle>]/<prefix>_rank"
                            "<rank>-of-<world>[_<tp><pp><dp><cp><ep>]_pid<pid>_<timestamp>"
                        ),
                        "description": (
                            "Trace name template, relative to output_dir. The default "
                            "makes a folder per capture window holding one trace per rank "
                            "(what Holistic Trace Analysis reads)."
                        ),
                        "examples": ["<prefix>_<role>_step<step>_rank<rank>",
                                     "<prefix>/<role>/step<step>/rank<rank>[_<tp><pp><dp>]"],
                    },
                    "mesh": _mesh(
                        "The role's own mesh, when its ranks lay out differently from the "
                        "top-level mesh (verl's rollout {dp: 4, tp: 2} beside an FSDP actor "
                        "{dp: 8}): same form; it replaces, never merges with, the mesh of "
                        "defaults. {}: the top-level mesh.", default={}),
                    "on_error": {
                        "enum": ["warn", "raise"],
                        "default": "warn",
                        "description": "What a backend failure at run time does.",
                    },
                    "keep": {
                        "enum": ["traces", "summaries"],
                        "default": "traces",
                        "description": (
                            "What stays of each torch trace once its rank has summarised "
                            "it (the figures analyze reads, in the manifest): traces keeps "
                            "the trace; summaries removes it when the summary was written "
                            "whole, and keeps it when the summary failed. limits.bytes "
                            "counts what stays."
                        ),
                    },
                    "triggers": {"$ref": "#/$defs/triggers"},
                    "export": {"$ref": "#/$defs/export"},
                    "limits": {"$ref": "#/$defs/limits"},
                },
            },
        },
    }
