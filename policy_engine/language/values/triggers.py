"""What opens captures beyond the planned steps, and what stops them: a role's
``triggers`` and ``limits`` blocks.

``triggers``: ``on_demand`` (requests written by ``policy-engine trigger``), ``signal``
(``SIGUSR2`` captures the next step) and ``slow_step`` (a step slower than ``factor`` times
the running median captures the step after it); ``stall`` (a step that runs past a limit
writes a stall record of every rank: where each one is, and what the others wait for).
``limits``: at most ``captures`` capture cycles and ``bytes`` written per role and process.
The schema fragments live here with the values they describe, so that the defaults cannot
drift from the model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from policy_engine.errors import is_int

__all__ = ["AFTER_PATTERN", "BYTES_PATTERN", "Limits", "SlowStep", "Stall", "Triggers",
           "limits_schema", "parse_after", "parse_bytes", "triggers_schema"]

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2,
          "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
#: A size as a policy writes it: ``2GiB``, ``500 MB``, ``1.5GB``, ``1048576``.
BYTES_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*([kKmMgGtT][iI]?[bB]?|[bB])?\s*$"
_SIZE = re.compile(BYTES_PATTERN)
#: ``stall.after`` as a multiple of the median step: ``10x``, ``2.5x``.
AFTER_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*[xX]\s*$"
_FACTOR = re.compile(AFTER_PATTERN)


def parse_bytes(value: int | str) -> int:
    """``2GiB`` -> 2147483648; ValueError for what :data:`BYTES_PATTERN` refuses."""
    if is_int(value):
        if value < 1:
            raise ValueError(f"a size must be at least 1 byte, got {value}")
        return value
    if not isinstance(value, str) or not _SIZE.match(value):
        raise ValueError(f"expected a size such as 2GiB or 500MB, got {value!r}")
    text = value.strip()
    number = re.match(r"[0-9.]+", text)
    assert number is not None  # the pattern matched
    unit = text[number.end():].strip().lower()
    unit = unit if unit in _UNITS else unit + "b"  # "2Gi" reads as 2GiB
    size = int(float(number.group()) * _UNITS[unit])
    if size < 1:
        raise ValueError(f"a size must be at least 1 byte, got {value!r}")
    return size


@attrs.frozen
class SlowStep:
    """``slow_step: {factor, after, max, window, scope, reference}``. ``scope: job``: the
    slow rank and the ``reference`` ranks (a rank selector) capture one later step, the
    same on all of them; ``process``: the slow process captures its next step alone."""

    factor: float = 2.0
    after: int = 10
    max: int = 3
    window: int = 50
    scope: str = "process"
    reference: Any = None  # None, or a rank selector as the policy wrote it


def parse_after(value: int | float | str) -> tuple[float | None, float | None]:
    """``stall.after`` as ``(seconds, factor)``, one of them None: ``300`` -> (300.0, None),
    ``"10x"`` -> (None, 10.0). ValueError for what the schema refuses."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not 0 < value < float("inf"):
            raise ValueError(f"stall.after must be a positive number of seconds, got {value}")
        return float(value), None
    if isinstance(value, str) and _FACTOR.match(value):
        factor = float(value.strip()[:-1])
        if factor <= 1:
            raise ValueError(f"stall.after {value!r}: a multiple of the median step must be "
                             "more than 1x")
        return None, factor
    raise ValueError(f"stall.after: expected seconds or a multiple of the median step such "
                     f"as '10x', got {value!r}")


@attrs.frozen
class Stall:
    """``stall: {after, at_least, max, job}``: a step that has run for longer than
    ``after`` (seconds, or ``factor`` x the median step, never less than ``at_least``
    seconds) makes the role's listener thread write a stall record of this process; with
    ``job``, it asks every rank of the job for theirs. At most ``max`` stalls per process
    are recorded."""

    seconds: float | None = None
    factor: float | None = None
    at_least: float = 10.0
    max: int = 10
    job: bool = True

    @property
    def after(self) -> float | str:
        """``after`` as the policy wrote it, for messages and the plan's JSON."""
        if self.factor is not None:
            return f"{self.factor:g}x"
        assert self.seconds is not None
        return self.seconds

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> Stall:
        seconds, factor = parse_after(raw.get("after", 300))
        return cls(seconds=seconds, factor=factor, at_least=float(raw.get("at_least", 10.0)),
                   max=int(raw.get("max", 10)), job=bool(raw.get("job", True)))

    def to_json(self) -> dict[str, Any]:
        return {"after": self.after, "at_least": self.at_least, "max": self.max,
                "job": self.job}


@attrs.frozen
class Triggers:
    """A role's ``triggers`` block; all off by default."""

    on_demand: bool = False
    signal: bool = False
    slow_step: SlowStep | None = None
    poll_seconds: float = 5.0
    #: how requests travel: ``auto`` (the job's c10d store when torch.distributed is up,
    #: else a named Ray actor under Ray, else the triggers/ folder), or one of them
    channel: str = "auto"
    #: the stall watch (None: off): it writes records, it opens no capture
    stall: Stall | None = None

    @property
    def any(self) -> bool:
        """Whether anything beyond the plan may open a capture."""
        return self.on_demand or self.signal or self.slow_step is not None

    @property
    def listens(self) -> bool:
        """Whether the role has a trigger to run: one that opens captures, or the stall
        watch."""
        return self.any or self.stall is not None

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> Triggers:
        slow = raw.get("slow_step")
        if slow is True:
            slow = {}
        stall = raw.get("stall")
        if stall is True:
            stall = {}
        return cls(on_demand=bool(raw.get("on_demand", False)),
                   signal=bool(raw.get("signal", False)),
                   slow_step=None if slow in (None, False) else SlowStep(
                       factor=float(slow.get("factor", 2.0)), after=slow.get("after", 10),
                       max=slow.get("max", 3), window=slow.get("window", 50),
                       scope=slow.get("scope", "process"), reference=slow.get("reference")),
                   poll_seconds=float(raw.get("poll_seconds", 5.0)),
                   channel=str(raw.get("channel", "auto")),
                   stall=None if stall in (None, False) else Stall.from_mapping(stall))

    def to_json(self) -> dict[str, Any]:
        slow = None if self.slow_step is None else attrs.asdict(self.slow_step)
        if slow is not None and slow["scope"] == "process" and slow["reference"] is None:
            del slow["scope"], slow["reference"]  # as before scope existed: same hashes
        out: dict[str, Any] = {"on_demand": self.on_demand, "signal": self.signal,
                               "slow_step": slow, "poll_seconds": self.poll_seconds}
        if self.channel != "auto":
            out["channel"] = self.channel
        if self.stall is not None:  # absent when off: the plans of before keep their hashes
            out["stall"] = self.stall.to_json()
        return out


@attrs.frozen
class Limits:
    """A role's ``limits`` block: None is no limit."""

    captures: int | None = None
    bytes: int | None = None
    #: ``bytes`` as the policy wrote it, for messages
    bytes_text: str | None = None

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> Limits:
        size = raw.get("bytes")
        return cls(captures=raw.get("captures"),
                   bytes=None if size is None else parse_bytes(size),
                   bytes_text=None if size is None else str(size).strip())

    def to_json(self) -> dict[str, Any]:
        return {"captures": self.captures, "bytes": self.bytes}


def triggers_schema() -> dict[str, Any]:
    slow = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "factor": {"type": ["number", "integer"], "minimum": 1, "default": 2.0,
                       "description": "A step slower than factor x the running median of "
                                      "recent steps is slow."},
            "after": {"type": "integer", "minimum": 1, "default": 10,
                      "description": "Steps measured before any step can count as slow."},
            "max": {"type": "integer", "minimum": 1, "default": 3,
                    "description": "Captures of slow steps per process, at most."},
            "window": {"type": "integer", "minimum": 3, "default": 50,
                       "description": "How many recent steps the median is taken over."},
            "scope": {"enum": ["process", "job"], "default": "process",
                      "description": "process: the slow process captures its next step; "
                                     "job: the slow rank and the reference ranks capture "
                                     "the same later step."},
            "reference": {
                "oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "array"},
                          {"type": "object"}, {"type": "null"}],
                "default": None,
                "description": "With scope: job, the ranks captured beside the slow one "
                               "(a rank selector: '0', '0-3', {tp: 0}).",
                "examples": ["0"]},
        },
    }
    stall = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "after": {
                "oneOf": [{"type": "number", "minimum": 0.1},
                          {"type": "string", "pattern": AFTER_PATTERN}],
                "default": 300,
                "description": "A step running longer than this is a stall: seconds, or "
                               "a multiple of the median step such as '10x'.",
                "examples": [300, "10x"]},
            "at_least": {"type": ["number", "integer"], "minimum": 0, "default": 10.0,
                         "description": "With after: 'Nx', a step is a stall only past "
                                        "this many seconds too."},
            "max": {"type": "integer", "minimum": 1, "default": 10,
                    "description": "Stalls recorded per process, at most."},
            "job": {"type": "boolean", "default": True,
                    "description": "Ask every rank of the job for its record too, over the "
                                   "job's channel."},
        },
    }
    return {
        "type": "object",
        "additionalProperties": False,
        "description": "What opens captures beyond the planned steps (docs/runtime.md, "
                       "Triggers).",
        "properties": {
            "on_demand": {"type": "boolean", "default": False,
                          "description": "Capture the steps `policy-engine trigger` asks for."},
            "signal": {"type": "boolean", "default": False,
                       "description": "SIGUSR2 captures the process's next step."},
            "slow_step": {
                "oneOf": [{"type": "boolean"}, {"type": "null"}, slow],
                "default": None,
                "description": "Capture the step after a slow one; true for the defaults.",
                "examples": [{"factor": 2.0, "after": 10, "max": 3}],
            },
            "poll_seconds": {"type": ["number", "integer"], "minimum": 0, "default": 5.0,
                             "description": "How often a process looks for requests and "
                                            "reports its progress."},
            "stall": {
                "oneOf": [{"type": "boolean"}, {"type": "null"}, stall],
                "default": None,
                "description": "When a step runs past `after`, write where every rank is "
                               "and what the others wait for (docs/runtime.md, Stalls); "
                               "true for the defaults.",
                "examples": [{"after": 300}, {"after": "10x"}],
            },
            "channel": {"enum": ["auto", "store", "ray", "folder"], "default": "auto",
                        "description": "How requests reach the processes: auto is the "
                                       "job's c10d store when torch.distributed is "
                                       "initialised, a named Ray actor under Ray, else "
                                       "the triggers/ folder."},
        },
    }


def limits_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "description": "A budget per role and process: once spent, no new capture begins.",
        "properties": {
            "captures": {"type": ["integer", "null"], "minimum": 1, "default": None,
                         "description": "Capture cycles (traces) recorded at most."},
            "bytes": {
                "oneOf": [{"type": "integer", "minimum": 1},
                          {"type": "string", "pattern": BYTES_PATTERN},
                          {"type": "null"}],
                "default": None,
                "description": "Bytes written at most, e.g. 2GiB or 500MB.",
                "examples": ["2GiB"],
            },
        },
    }
