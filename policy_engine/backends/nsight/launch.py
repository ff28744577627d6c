"""Nsight Systems launch arguments, computed from a plan.

nsys is told at launch how capture ranges end. ``--capture-range-end=repeat-shutdown:N``
writes the reports right after the N-th range closes; with a wrong N they appear only
when the process exits (or never, if it is killed). The engine knows the plan, so it can
give the exact N. The CLI (``policy-engine nsys-args``) and the nsight backend both use
this module, so what a launch expects and what a process opens cannot drift apart.

Pure Python: no torch, no nvtx, nothing that needs the tool.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import attrs

from policy_engine.language.values.naming import NameTemplate
from policy_engine.settings.nsight import CAPTURE_DOMAIN as CAPTURE_DOMAIN
from policy_engine.settings.nsight import CAPTURE_RANGE as CAPTURE_RANGE
from policy_engine.settings.nsight import long_option as _long
from policy_engine.settings.nsight import option_text as _text
from policy_engine.settings.nsight import options_problems as options_problems

#: The NVTX domain of region ranges when the policy names none: the default of
EXTENSION = ".nsys-rep"

_SHUTDOWN = ("stop-shutdown", "repeat-shutdown")
_TOKEN = re.compile(r"%(%|p|h|q\{([^}]*)\})")


class NsysArgsError(ValueError):
    """The policy and the launch facts admit no correct nsys arguments."""


# -------------------------------------------------------------------- output names

#: Fields nsys substitutes itself at launch; the rest of the name is fixed by the plan.
_NSYS_FIELDS = {"pid": "%p", "host": "%h"}
#: Fields an nsys output cannot hold: nsys appends ``.N`` per capture range instead.
_PER_CAPTURE = ("step", "region", "cycle", "timestamp")


def nsys_output(template: NameTemplate, output_dir: str, *, generic_rank: bool = False) -> str:
    """``-o`` for nsys: the name with nsys's own substitutions where only launch knows.

    ``<pid>`` -> ``%p``, ``<host>`` -> ``%h``, ``<env:X>`` -> ``%q{X}``, and with
    ``generic_rank`` ``<rank>`` -> ``%q{RANK}``. Per-capture fields render empty and the
    separators they leave are dropped.
    """
    subst = dict(_NSYS_FIELDS)
    subst.update({f: f"%q{{{f[4:]}}}" for f in template.fields() if f.startswith("env:")})
    if generic_rank:
        subst["rank"] = "%q{RANK}"
    # Sentinels are plain letters, so sanitizing leaves them alone; tidying happens before
    # the tokens go in, because %q{LOCAL_RANK} holds an underscore of its own.
    sentinels = {name: f"PENSYS{i}X" for i, name in enumerate(subst)}
    unbound = attrs.evolve(
        template,
        bound=tuple((k, v) for k, v in template.bound if k not in subst and k not in _PER_CAPTURE),
    )
    text = unbound.render(sentinels)
    parts = [re.sub(r"_{2,}", "_", comp).strip("_") for comp in text.split("/")]
    text = "/".join(p for p in parts if p)
    for name, sentinel in sentinels.items():
        text = text.replace(sentinel, subst[name])
    return os.path.join(output_dir, text)


def resolve_output(output: str, *, pid: int, host: str, environ: Mapping[str, str]) -> str:
    """``output`` as nsys expands it in this process (an unset ``%q{X}`` stays as it is)."""

    def expand(match: re.Match[str]) -> str:
        token = match.group(1)
        if token == "%":
            return "%"
        if token == "p":
            return str(pid)
        if token == "h":
            return host
        return environ.get(match.group(2), match.group(0))

    return _TOKEN.sub(expand, output)


def report_path(output: str, index: int, *, numbered: bool) -> str:
    """The report nsys writes for capture range ``index`` (0-based).

    nsys numbers reports from 1 when a session writes more than one, and writes a single
    report without a number.
    """
    return f"{output}.{index + 1}{EXTENSION}" if numbered else output + EXTENSION


# -------------------------------------------------------------------- arguments


@attrs.frozen
class NsysLaunch:
    """What goes between ``nsys profile`` and the program, and the same for Ray."""

    args: tuple[str, ...]
    ray: Mapping[str, str]
    capture_range_end: str
    notes: tuple[str, ...] = ()


def capture_range_end(setting: str, ranges: int | None) -> tuple[str, str]:
    """The ``--capture-range-end`` value for ``setting``, and when reports appear."""
    if ranges == 0:
        raise NsysArgsError("the plan opens no capture range: launch without nsys")
    if setting in ("auto", "repeat-shutdown") and ranges is not None:
        return f"repeat-shutdown:{ranges}", f"right after capture range {ranges} closes"
    if setting == "repeat-shutdown":
        raise NsysArgsError(
            "capture_range_end repeat-shutdown needs a known number of "
            "capture ranges, and the plan cannot say how many"
        )
    if setting in ("auto", "repeat"):
        value = "repeat" if ranges is None else f"repeat:{ranges}"
        return value, "when the process exits"
    if setting in ("stop", "stop-shutdown"):
        after = "right after it closes" if setting == "stop-shutdown" else "at exit"
        return setting, f"the first capture range only, {after}"
    raise NsysArgsError(f"unknown capture_range_end {setting!r}")


def nsys_profile_args(
    *,
    capture: str,
    ranges: int | None,
    capture_range_end_setting: str,
    options: Mapping[str, object],
    output: str | None,
) -> NsysLaunch:
    """The ``nsys profile`` arguments for one process.

    ``capture``: ``nvtx``, ``cuda_profiler_api`` or ``auto`` (launched as ``nvtx``: in
    auto mode the engine always opens the NVTX range, with or without a GPU).
    ``ranges``: capture ranges the process opens (None: unknown).
    ``output``: the ``-o`` value (see :func:`nsys_output`), or None to leave nsys's default.
    """
    end, when = capture_range_end(capture_range_end_setting, ranges)
    pairs: list[tuple[str, str]] = []
    if capture == "cuda_profiler_api":
        pairs.append(("capture-range", "cudaProfilerApi"))
    else:
        pairs += [("capture-range", "nvtx"), ("nvtx-capture", f"{CAPTURE_RANGE}@{CAPTURE_DOMAIN}")]
    pairs.append(("capture-range-end", end))
    user = [(key.replace("_", "-"), _text(value)) for key, value in options.items()]
    # nsys's default --kill sigterm ends the training when the session shuts down.
    if end.split(":")[0] in _SHUTDOWN and not any(_long(k) == "kill" for k, _ in user):
        pairs.append(("kill", "none"))
    pairs += user
    if output is not None:
        pairs.append(("o", output))
    args: list[str] = []
    for key, value in pairs:
        args += [f"-{key}", value] if len(key) == 1 else [f"--{key}={value}"]
    notes = [f"reports: {when}"]
    if ranges is None:
        notes.append(
            "the plan does not bound the number of capture ranges, so nsys "
            "cannot shut its session down early"
        )
    elif end.startswith("stop") and ranges > 1:
        notes.append(f"the process opens {ranges} capture ranges; nsys records the first")
    return NsysLaunch(tuple(args), dict(pairs), end, tuple(notes))
