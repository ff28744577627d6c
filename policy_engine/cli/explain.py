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
from policy_engine.plan.predict import Entry, RankGroup, entries


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
    ranks = entries(policy, args.role, world=world, lo=lo, hi=hi, inner=args.inner_steps,
                    local_world=args.local_world, region_calls=args.region_calls,
                    files=plan_files if args.format == "json" else None)
    forecasts: Forecasts | None = None
    if args.sizes_from:
        forecasts = Forecasts(read_sizes(args.sizes_from), args.role)
    if args.format == "json":
        _print_json(args.role, world, ranks, forecasts)
    else:
        _print_text(args.role, world, lo, hi, ranks, forecasts)
        if forecasts is not None:
            print(_total_line(forecasts.total, lo, hi))
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


class Forecasts:
    """The size forecast of each profiled rank (:func:`forecast`, the same for every rank
    of a :class:`RankGroup`), and ``total``: the sum over the ranks asked about."""

    def __init__(self, sizes: Sizes, role: str) -> None:
        self.sizes, self.role = sizes, role
        self.total: dict[str, Any] = {"bytes": 0, "traces": 0, "processes": 0, "unknown": 0}
        self._found: dict[int, dict[str, Any] | None] = {}  # id(group) -> its forecast

    def of(self, group: RankGroup) -> dict[str, Any] | None:
        """The forecast of one rank of ``group``, counted in ``total``."""
        key = id(group)
        if key not in self._found:
            self._found[key] = forecast(group.entry, self.sizes, self.role)
        found = self._found[key]
        if found is not None:
            total = self.total
            total["processes"] += 1
            if found["bytes"] is None:
                total["unknown"] += 1
            else:
                total["bytes"] += found["bytes"]
                total["traces"] += found["traces"]
        return found


def _total_line(total: dict[str, Any], lo: int, hi: int) -> str:
    line = (f"forecast for steps {lo}-{hi}: {total['traces']} traces, {size_cell(total['bytes'])} "
            f"over {total['processes']} profiled processes")
    if total["unknown"]:
        line += f" ({total['unknown']} with nothing to go by)"
    return line


def _print_json(role: str, world: int, ranks: Iterable[Entry],
                forecasts: Forecasts | None = None) -> None:
    """One rank per line: readable, and fast for 65536 ranks (each is its group's JSON
    with its place filled in, or a format of its place where it does not profile)."""
    out = sys.stdout
    out.write(f'{{"role": {json.dumps(role)}, "world": {world}, "ranks": [\n  ')
    encode = json.JSONEncoder().encode
    batch: list[str] = []
    sep = ""
    shapes: dict[tuple[str, ...], str] = {}  # the coordinates' names -> a rank's text
    for entry in ranks:
        place, group = entry
        if group is not None:
            text = group.json(place)
            found = None if forecasts is None else forecasts.of(group)
            batch.append(text if found is None
                         else f'{text[:-1]}, "forecast": {encode(found)}}}')
        else:
            names = tuple(place.coords)
            shape = shapes.get(names)
            if shape is None:
                shape = shapes[names] = _unprofiled(names)
            batch.append(shape % (place.rank, *place.coords.values(), place.local_rank,
                                  place.node))
        if len(batch) == 4096:  # few large writes instead of one per rank
            out.write(sep + ",\n  ".join(batch))
            batch.clear()
            sep = ",\n  "
    if batch:
        out.write(sep + ",\n  ".join(batch))
    total = "" if forecasts is None else f', "forecast": {json.dumps(forecasts.total)}'
    out.write("\n]" + total + "}\n")


def _unprofiled(dims: tuple[str, ...]) -> str:
    """The JSON of a rank that does not profile, with these coordinates, as a ``%``
    format of its rank, coordinates, local rank and node: most ranks of a large world are
    these, and the encoder would be the larger part of their cost."""
    coords = ", ".join(f'"{dim}": %d' for dim in dims)
    return (f'{{"rank": %d, "profiled": false, "coords": {{{coords}}}, '
            '"local_rank": %d, "node": %d}')


def _coords(coords: dict[str, int]) -> str:
    """`` (tp0pp1dp0)``, the rank's mesh coordinates; nothing without a mesh."""
    text = "".join(f"{k}{v}" for k, v in coords.items())
    return f" ({text})" if text else ""


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
    """The steps, each run of three or more at one stride folded with its count: a run of
    consecutive steps always (``2,3,10-1009 (1000)``), one of periodic steps where that
    is shorter (``100-100000 every 100 (1000)``): a long window is one item, not a
    thousand."""
    parts: list[str] = []
    at = 0
    while at < len(steps):
        end = at
        stride = steps[at + 1] - steps[at] if at + 1 < len(steps) else 0
        while end + 1 < len(steps) and steps[end + 1] - steps[end] == stride:
            end += 1
        count = end - at + 1
        folded = f"{steps[at]}-{steps[end]}" + (f" every {stride}" if stride > 1 else "") + \
            f" ({count})"
        listed = ",".join(map(str, steps[at:end + 1]))
        if count >= 3 and (stride == 1 or len(folded) < len(listed)):
            parts.append(folded)
            at = end + 1
        else:  # the next step may begin a run of its own
            parts.append(str(steps[at]))
            at += 1
    return ",".join(parts)


def _beyond_plan(entry: dict[str, Any]) -> list[str]:
    """The lines on triggers, limits and what is kept: what the step list does not
    show."""
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
    if entry.get("keep") == "summaries":
        out.append("keep: summaries (each torch trace listed is removed once its rank has "
                   "summarised it; its figures stay in the manifest)")
    return out


def _runs(ranks: Iterable[Entry]) -> Iterator[list[Entry]]:
    """Runs of consecutive ranks that behave alike: none profiles, or each profiles the
    same steps with the same actions."""
    run: list[Entry] = []
    for entry in ranks:
        if run:
            last = run[-1].group
            group = entry.group
            same = last is group or (
                last is not None and group is not None
                and last.entry["steps"] == group.entry["steps"]
                and last.entry["actions"] == group.entry["actions"])
            if not same:
                yield run
                run = []
        run.append(entry)
    if run:
        yield run


def _print_text(role: str, world: int, lo: int, hi: int, ranks: Iterable[Entry],
                forecasts: Forecasts | None = None) -> None:
    print(f"role {role}, world {world}, outer steps {lo}-{hi}")
    for run in _runs(ranks):
        first, last = run[0].place, run[-1].place
        span = (f"rank {first.rank}" if len(run) == 1
                else f"ranks {first.rank}-{last.rank}")
        group = run[0].group
        if group is None:
            print(f"  {span}: not profiled")
            continue
        entry = group.entry
        found = None
        if forecasts is not None:  # each rank counts in the total; the first is shown
            found = forecasts.of(group)
            for other in run[1:]:
                assert other.group is not None
                forecasts.of(other.group)
        steps = _steps(entry["steps"]) or "none in range"
        print(f"  {span}: profiled with {' + '.join(entry['backends'])}, steps {steps}")
        if "regions" in entry:  # discrete: each region call is a capture with its schedule
            for region, acts in entry["regions"].items():
                print(f"    {region} (each call a capture), actions per inner step: "
                      f"{_actions(acts)}")
        else:
            print(f"    actions per inner step: {_actions(entry['actions'])}")
        if entry["inner_steps"] == 1:
            print("    traces assume 1 prof.step() per outer step (--inner-steps N for more)")
        for line in _beyond_plan(entry):
            print(f"    {line}")
        if found is not None:
            print("    forecast: " + (
                f"{found['traces']} traces x {size_cell(found['bytes_per_trace'])} = "
                f"{size_cell(found['bytes'])} per process ({found['why']})"
                if found["bytes"] is not None else found["why"]))
        shown = run if len(run) <= 4 else [run[0], run[-1]]
        for one in shown:
            assert one.group is not None
            print(f"    rank {one.place.rank}{_coords(one.place.coords)}: "
                  f"{one.group.name(one.place)}")
        if len(run) > 4:
            print(f"    ... {len(run) - 2} more ranks")
