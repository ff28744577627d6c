"""Size forecasts from an earlier run: ``explain --sizes-from DIR`` and
``validate --sizes-from DIR``.

The manifests under DIR say how many bytes each trace of each role took. A role's size
per trace is the median of its complete files, per backend (``[torch, memory]`` writes
two files a cycle); a role the earlier run did not profile takes the median of every
role's files, and says so. The plan says how many traces a process writes; the product
is the forecast.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import attrs

from policy_engine.analysis.format import size_cell
from policy_engine.cli.usage import UsageError
from policy_engine.errors import is_int
from policy_engine.files.records import Status
from policy_engine.language.model import Policy, RoleSpec
from policy_engine.plan.captures import count_ranges


@attrs.frozen
class Sizes:
    """Bytes per trace file measured in an earlier run."""

    source: str
    #: (role, backend) -> the sizes of its complete trace files
    files: Mapping[tuple[str, str], tuple[int, ...]]

    def per_trace(self, role: str, backends: tuple[str, ...]) -> tuple[int, str] | None:
        """The bytes one cycle of ``role`` writes (every backend's file), and where the
        figure comes from; None when the earlier run wrote nothing to go by."""
        total, how = 0, []
        for backend in backends:
            own = self.files.get((role, backend))
            if own:
                total += int(statistics.median(own))
                how.append(f"median of {len(own)} {backend} traces of role {role!r}")
                continue
            others = [n for (_, b), sizes in self.files.items() if b == backend
                      for n in sizes]
            if not others:
                return None
            total += int(statistics.median(others))
            how.append(f"median of {len(others)} {backend} traces of other roles (none "
                       f"of {role!r})")
        return total, "; ".join(how) + f", under {self.source}"


def add_sizes_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--sizes-from DIR``: ``what`` the command does with the sizes it reads."""
    parser.add_argument("--sizes-from", metavar="DIR",
                        help=f"{what} from the manifests of an earlier run under DIR")


def read_sizes(folder: str) -> Sizes:
    """The sizes of every complete trace under ``folder``'s manifests (UsageError when
    there is none to go by)."""
    from policy_engine.analysis.manifests import scan_manifests  # with --sizes-from only

    scan = scan_manifests(folder)
    files: dict[tuple[str, str], list[int]] = defaultdict(list)
    for record in scan.records:
        if record["event"] != "trace" or record.get("status") != Status.COMPLETE:
            continue
        size = record.get("bytes")
        if not is_int(size) or size <= 0:
            continue
        backend = str(record.get("backend") or "torch")
        for part in backend.split("+") if "+" in backend else (backend,):
            files[(str(record.get("role") or ""), part)].append(size)
    if not files:
        raise UsageError(f"--sizes-from {folder}: no complete trace with a size in its "
                         "manifests (the folder of an earlier run's output_dir)")
    return Sizes(folder, {k: tuple(v) for k, v in files.items()})


def forecast(entry: dict[str, Any], sizes: Sizes, role: str) -> dict[str, Any] | None:
    """An explain rank entry's forecast: traces it lists x bytes per trace."""
    if not entry.get("profiled"):
        return None
    found = sizes.per_trace(role, tuple(entry.get("backends") or [entry["backend"]]))
    if found is None:
        return {"bytes": None, "why": f"no trace of backend {entry['backend']} under "
                                      f"{sizes.source}"}
    each, why = found
    count = len(entry["traces"])
    return {"traces": count, "bytes_per_trace": each, "bytes": count * each, "why": why}


def planned_traces(spec: RoleSpec) -> int | None:
    """The trace files (cycles) one profiled process of ``spec`` writes over the whole run,
    as ``nsys-args`` counts capture ranges; None when the plan cannot say (endless steps,
    or a schedule that repeats without end over an unknown number of inner steps)."""
    # Here, not at the top: validate imports this module and pays for compile only
    # when it forecasts (--sizes-from).
    from policy_engine.plan.compile import counting_plan
    return count_ranges(counting_plan(spec), region_calls=1 if spec.discrete else None).total


def budget_problems(policy: Policy, sizes: Sizes) -> list[tuple[str, str, str]]:
    """(role, field, message) for each role whose forecast exceeds its ``limits.bytes``."""
    out = []
    for role in policy.role_names:
        spec = policy.role(role)
        limit = spec.limits.bytes
        if not spec.enabled or limit is None:
            continue
        traces = planned_traces(spec)
        found = sizes.per_trace(role, spec.backends or (spec.backend,))
        if traces is None or found is None or traces * found[0] <= limit:
            continue
        each, why = found
        out.append((role, "limits", (
            f"forecast {size_cell(traces * each)} per process ({traces} traces x "
            f"{size_cell(each)}: {why}) exceeds limits.bytes {spec.limits.bytes_text}: "
            f"captures stop after about {max(1, -(-limit // each))} traces")))
    return out
