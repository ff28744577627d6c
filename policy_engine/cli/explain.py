"""policy-engine explain FILE --role R: what the policy does on every rank."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from policy_engine import backends
from policy_engine.analysis.format import size_cell
from policy_engine.backends.files import name_files
from policy_engine.cli import explain_schedule
from policy_engine.cli._common import (
    add_format_option,
    load_role_layout,
    policy_parser,
    positive_int,
)
from policy_engine.cli.forecast import Sizes, add_sizes_option, forecast, read_sizes
from policy_engine.cli.usage import UsageError
from policy_engine.plan.plan import Plan
from policy_engine.plan.predict import iter_ranks


def add_parser(sub: Any, name: str, help: str) -> None:
    parser = policy_parser(sub, name, help, __doc__, role={"required": True})
    parser.add_argument("--steps", default="0-20", metavar="A-B",
                        help="outer steps to show (default 0-20)")
    parser.add_argument("--inner-steps", type=positive_int, metavar="N",
                        help="prof.step() calls per outer step (per region call, discrete); "
                             "default: 1 when each cycle of a merged capture is named by its "
                             "own step (torchtitan-like), else enough to run the schedule "
                             "through")
    parser.add_argument("--local-world", type=positive_int, metavar="N",
                        help="processes per node (for <node>/<local_rank>)")
    parser.add_argument("--region-calls", type=positive_int, default=1, metavar="N",
                        help="discrete mode: calls of each region per step (default 1)")
    add_sizes_option(parser, "forecast bytes per trace and in total")
    add_format_option(parser)
    parser.set_defaults(run=run)


def _window(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if not match:
        raise UsageError(f"--steps {text!r}: expected A-B or N, such as 1-20")
    lo = int(match.group(1))
    hi = int(match.group(2) or lo)
    if hi < lo:
        raise UsageError(f"--steps {text!r}: range is reversed")
    return lo, hi


def run(args: argparse.Namespace) -> int:
    policy, world = load_role_layout(args, "explain")
    lo, hi = _window(args.steps)
    ranks = iter_ranks(policy, args.role, world=world, lo=lo, hi=hi, inner=args.inner_steps,
                       local_world=args.local_world, region_calls=args.region_calls,
                       files=plan_files if args.format == "json" else None)
    total: dict[str, Any] | None = None
    if args.sizes_from:
        sizes = read_sizes(args.sizes_from)
        total = {"bytes": 0, "traces": 0, "processes": 0, "unknown": 0}
        ranks = _with_forecast(ranks, sizes, args.role, total)
    if args.format == "json":
        _print_json(args.role, world, ranks, total)
    else:
        _print_text(args.role, world, lo, hi, ranks)
        if total is not None:
            print(_total_line(total, lo, hi))
    if args.inner_steps is not None:
        for line in explain_schedule.warnings(policy, args.role, world, lo, hi,
                                              args.inner_steps):
            print(f"policy-engine explain: warning: {line}", file=sys.stderr)
    return 0


def plan_files(plan: Plan) -> Callable[[str, int], list[dict[str, Any]]]:
    """What lists the files of one trace of ``plan`` (by name and index among the
    process's traces): each backend of the role, with the settings the runtime gives its
    captures, names them as its session does (:mod:`policy_engine.backends.files`)."""
    parts = [(name, backends.session_settings(name, plan) if name == plan.backend
              else plan.spec.blocks[name]) for name in plan.backends]
    output_dir = plan.output_dir

    def files(name: str, index: int) -> list[dict[str, Any]]:
        return [found for backend, settings in parts
                for found in name_files(backend, settings, output_dir, name, index)]
    return files


def _with_forecast(ranks: Iterable[dict[str, Any]], sizes: Sizes, role: str,
                   total: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for entry in ranks:
        found = forecast(entry, sizes, role)
        if found is not None:
            entry["forecast"] = found
            total["processes"] += 1
            if found["bytes"] is None:
                total["unknown"] += 1
            else:
                total["bytes"] += found["bytes"]
                total["traces"] += found["traces"]
        yield entry


def _total_line(total: dict[str, Any], lo: int, hi: int) -> str:
    line = (f"forecast for steps {lo}-{hi}: {total['traces']} traces, {size_cell(total['bytes'])} "
            f"over {total['processes']} profiled processes")
    if total["unknown"]:
        line += f" ({total['unknown']} with nothing to go by)"
    return line


def _print_json(role: str, world: int, ranks: Iterable[dict[str, Any]],
                total: dict[str, Any] | None = None) -> None:
    """One rank per line: readable, and fast for 65536 ranks (the C encoder does it)."""
    out = sys.stdout
    out.write(f'{{"role": {json.dumps(role)}, "world": {world}, "ranks": [\n  ')
    encode = json.JSONEncoder().encode
    batch: list[str] = []
    sep = ""
    shapes: dict[tuple[str, ...], str] = {}  # the coordinates' names -> a rank's text
    for entry in ranks:
        if entry["profiled"]:
            batch.append(encode(entry))
            continue
        coords = entry["coords"]
        names = tuple(coords)
        shape = shapes.get(names)
        if shape is None:
            shape = shapes[names] = _unprofiled(names)
        batch.append(shape % (entry["rank"], *coords.values(), entry["local_rank"],
                              entry["node"]))
        if len(batch) == 4096:  # few large writes instead of one per rank
            out.write(sep + ",\n  ".join(batch))
            batch.clear()
            sep = ",\n  "
    if batch:
        out.write(sep + ",\n  ".join(batch))
    out.write("\n]" + ("" if total is None else f', "forecast": {json.dumps(total)}') + "}\n")


def _unprofiled(dims: tuple[str, ...]) -> str:
    """The JSON of a rank that does not profile, with these coordinates, as a ``%``
    format of its rank, coordinates, local rank and node: most ranks of a large world are
    these, and the encoder would be the larger part of their cost."""
    coords = ", ".join(f'"{dim}": %d' for dim in dims)
    return (f'{{"rank": %d, "profiled": false, "coords": {{{coords}}}, '
            '"local_rank": %d, "node": %d}')


def _coords(entry: dict[str, Any]) -> str:
    """`` (tp0pp1dp0)``, the rank's mesh coordinates; nothing without a mesh."""
    coords = "".join(f"{k}{v}" for k, v in entry["coords"].items())
    return f" ({coords})" if coords else ""


def _actions(acts: list[str]) -> str:
    """The schedule's actions, a run of three or more alike folded (``NONE x5``); without
    a schedule every inner step records, said once."""
    if acts and all(a == "RECORD" for a in acts):
        return "RECORD at every inner step (no schedule: each capture is recorded whole)"
    runs: list[list[Any]] = []
    for act in acts:
        if runs and runs[-1][0] == act:
            runs[-1][1] += 1
        else:
            runs.append([act, 1])
    return " ".join(f"{act} x{n}" if n > 2 else " ".join([act] * n) for act, n in runs)


def _steps(steps: list[int]) -> str:
    """The steps, a run of three or more consecutive ones folded with its count
    (``2,3,10-1009 (1000)``): a long window is one item, not a thousand."""
    parts: list[str] = []
    at = 0
    while at < len(steps):
        end = at
        while end + 1 < len(steps) and steps[end + 1] == steps[end] + 1:
            end += 1
        if end - at >= 2:
            parts.append(f"{steps[at]}-{steps[end]} ({end - at + 1})")
        else:
            parts.extend(map(str, steps[at:end + 1]))
        at = end + 1
    return ",".join(parts)


def _beyond_plan(entry: dict[str, Any]) -> list[str]:
    """The lines on triggers and limits: captures the step list does not show."""
    out = []
    found = entry.get("triggers")
    if found:
        what = [w for w, on in (("policy-engine trigger requests", found["on_demand"]),
                                ("SIGUSR2", found["signal"])) if on]
        slow = found["slow_step"]
        if slow:
            what.append(f"the step after one slower than {slow['factor']:g}x the median "
                        f"(after {slow['after']} steps, at most {slow['max']})")
        out.append("triggers also capture: " + "; ".join(what))
    limits = entry.get("limits")
    if limits:
        parts = [f"{limits['captures']} captures" if limits["captures"] else "",
                 size_cell(limits["bytes"]) if limits["bytes"] else ""]
        out.append("limits: at most " + " and ".join(p for p in parts if p) +
                   " per process (traces past them are not listed)")
    return out


def _print_text(role: str, world: int, lo: int, hi: int,
                ranks: Iterable[dict[str, Any]]) -> None:
    print(f"role {role}, world {world}, outer steps {lo}-{hi}")
    groups: list[list[dict[str, Any]]] = []
    for entry in ranks:
        last = groups[-1][-1] if groups else None
        same = last is not None and last["profiled"] == entry["profiled"] and (
            not entry["profiled"] or (last["steps"] == entry["steps"]
                                      and last["actions"] == entry["actions"]))
        if same:
            groups[-1].append(entry)
        else:
            groups.append([entry])
    for group in groups:
        first, last = group[0], group[-1]
        span = (f"rank {first['rank']}" if len(group) == 1
                else f"ranks {first['rank']}-{last['rank']}")
        if not first["profiled"]:
            print(f"  {span}: not profiled")
            continue
        steps = _steps(first["steps"]) or "none in range"
        print(f"  {span}: profiled with {' + '.join(first['backends'])}, steps {steps}")
        if "regions" in first:  # discrete: each region call is a capture with its schedule
            for region, acts in first["regions"].items():
                print(f"    {region} (each call a capture), actions per inner step: "
                      f"{_actions(acts)}")
        else:
            print(f"    actions per inner step: {_actions(first['actions'])}")
        if first["inner_steps"] == 1:
            print("    traces assume 1 prof.step() per outer step (--inner-steps N for more)")
        for line in _beyond_plan(first):
            print(f"    {line}")
        found = first.get("forecast")
        if found is not None:
            print("    forecast: " + (
                f"{found['traces']} traces x {size_cell(found['bytes_per_trace'])} = "
                f"{size_cell(found['bytes'])} per process ({found['why']})"
                if found["bytes"] is not None else found["why"]))
        shown = group if len(group) <= 4 else [group[0], group[-1]]
        for entry in shown:
            print(f"    rank {entry['rank']}{_coords(entry)}: {entry['name']}")
        if len(group) > 4:
            print(f"    ... {len(group) - 2} more ranks")
