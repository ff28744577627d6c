"""The analysis as text for a terminal: one block per capture window.

Up to :data:`RANK_ROWS` ranks get a row each; a larger window shows the spread across
ranks and the slowest ranks, so the text stays short at thousands of ranks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from policy_engine.analysis.stalls import stalls_text
from policy_engine.errors import printable

if TYPE_CHECKING:
    from policy_engine.analysis.answers import RunAnalysis, WindowAnalysis
    from policy_engine.analysis.hta import HtaAnswer
    from policy_engine.analysis.summary import TimelineFigure
    from policy_engine.analysis.window import RankTotals
    from policy_engine.analysis.windows import Dropped, Limit, OtherTrace, SlowStep, WindowWhy

RANK_ROWS = 16
SLOWEST = 5


def ms(us: float | None) -> str:
    """Microseconds as milliseconds for people."""
    if us is None:
        return "-"
    return f"{us / 1000:.1f}" if abs(us) >= 100 else f"{us / 1000:.3f}"


def _spread(s: dict[str, float] | None) -> str:
    return "-" if s is None else f"{ms(s['min'])} / {ms(s['median'])} / {ms(s['max'])}"


def why(found: WindowWhy | None) -> str:
    """Why a window's capture exists (its ``why``), in words (and any rank's other
    reason)."""
    if not found:
        return "found on disk (no manifest)"
    said = _trigger(found["trigger"], found.get("request"), found.get("slow") or [])
    others = [f"rank {a['rank']}: {_trigger(a['trigger'], a.get('request'))}"
              for a in found.get("also") or []]
    return said + (f" ({'; '.join(others)})" if others else "")


def _trigger(trigger: str, request: Any, slow: Sequence[SlowStep] = ()) -> str:
    """A trigger in words: with its request, or the slow steps behind it."""
    if trigger == "plan":
        return "the policy's plan"
    if trigger == "on_demand":
        return f"on demand (request {request or '?'})"
    if trigger == "signal":
        return "a signal (SIGUSR2)"
    if trigger == "slow_step":
        said = "; ".join(
            f"rank {s.get('rank')} took {s.get('seconds')} s at step {s.get('step')} "
            f"(median {s.get('median')} s)" for s in slow[:4])
        return "a slow step" + (f": {said}" if said else "")
    return str(trigger)


def notes(limits: Iterable[Limit] | None, dropped: Iterable[Dropped] | None,
          other: Iterable[OtherTrace] | None) -> list[str]:
    """Limits reached and backends that wrote nothing in a window (its ``limits``,
    ``dropped`` and ``other``)."""
    out = [f"limit: {x['why']}" for x in limits or []]
    wrote_none: dict[tuple[str, str], list[Any]] = {}
    for d in dropped or []:
        wrote_none.setdefault((str(d.get("backend") or "?"), str(d["why"])),
                              []).append(d["rank"])
    out += [f"backend {b} wrote nothing on rank(s) {_ranks(r)}: {w}"
            for (b, w), r in wrote_none.items()]
    others = sorted({str(o.get("backend")) for o in other or []})
    if others:
        out.append(f"not analysed (not torch traces): {', '.join(others)}")
    return out


def _ranks(ranks: list[Any]) -> str:
    ints = sorted(r for r in ranks if isinstance(r, int))
    if len(ints) > 8:
        return f"{', '.join(map(str, ints[:8]))}, ... ({len(ints)} ranks)"
    return ", ".join(map(str, ints)) or "?"


def rank_rows(w: WindowAnalysis) -> list[tuple[Any, str, RankTotals]]:
    """(rank, basis, totals) of the readable ranks, in rank order."""
    if w.figures is None:
        return []
    return sorted(w.figures.rows(), key=lambda r: (not isinstance(r[0], int), r[0] or 0))


def _rank_rows(read: list[tuple[Any, str, RankTotals]], straggler: Any) -> list[str]:
    rows: Iterable[tuple[Any, str, RankTotals]] = read
    if len(read) > RANK_ROWS:
        rows = sorted(read, key=lambda r: -r[2]["compute_us"])[:SLOWEST]
    rows = list(rows)
    device = any(t.get("gpu_timeline") for _r, _b, t in rows)
    lines = ["  rank   basis  time ms    compute   comm      overlap   idle"
             + ("      device total / idle ms" if device else "")]
    for rank, basis, t in rows:
        mark = "  <- straggler" if rank == straggler else ""
        seen = t.get("gpu_timeline")
        on_device = (f"      {ms(seen['total_us'])} / {ms(seen['idle_us'])}" if seen
                     else "      -") if device else ""
        lines.append((f"  {rank!s:<6} {basis:<6} {ms(t['time_us']):<10} "
                      f"{ms(t['compute_us']):<9} {ms(t['comm_us']):<9} "
                      f"{ms(t['overlap_us']):<9} {ms(t['idle_us']):<9}{on_device}{mark}"
                      ).rstrip())
    if len(read) > RANK_ROWS:
        lines[0] += f"   ({SLOWEST} of {len(read)} ranks with the most compute)"
    return lines


def window_text(window: WindowAnalysis) -> list[str]:
    w = window
    lines = [f"== {w.title}: {len(w.docs)} rank(s); captured because of {why(w.why)}"]
    lines += [f"  note: {n}" for n in notes(w.limits, w.dropped, w.other)]
    s = w.straggler
    if s:
        others = s.get("others_wait_us") or {}
        lines.append(
            f"  STRAGGLER: rank {s['rank']} in {len(s['steps'])} of {s['of_steps']} steps: "
            f"arrives {ms(s['late_us'])} ms after the median rank; it waits "
            f"{ms(s['wait_us'])} ms in collectives, the others {ms(others.get('median'))} ms "
            f"(median)")
    elif any(step["collectives"] for step in w.step_times):
        lines.append("  no straggler: no rank is consistently the one the others wait for")
    device = any(step.get("gpu_timeline") for step in w.step_times)
    if w.step_times:
        lines.append("  profiler step   time ms min / median / max     comm ms median   "
                     + ("device total / idle ms   " if device else "") + "straggler")
        for step in w.step_times:
            name = "whole trace" if step["step"] is None else str(step["step"])
            late = (f"rank {step['straggler']} (+{ms(step['late_us'])} ms)"
                    if step["straggler"] is not None else "-")
            comm = step["comm_us"]["median"] if step["comm_us"] else None
            seen = step.get("gpu_timeline")
            on_device = f"{_median(seen, 'total_us')} / {_median(seen, 'idle_us')}" \
                if device else ""
            lines.append(f"  {name:<15} {_spread(step['time_us']):<31} {ms(comm):<16} "
                         + (f"{on_device:<25}" if device else "") + late)
    lines += device_lines(w.gpu_timeline, len(w.docs))
    b = w.breakdown
    read = rank_rows(window)
    if b and len(read) > RANK_ROWS:
        for key in ("compute_us", "comm_us", "idle_us"):
            lines.append(f"  {key[:-3]:<8} across ranks (ms): {_spread(b[key])}")
    lines += _rank_rows(read, s["rank"] if s else None)
    lines += calls_text(w.collectives)
    for region in w.regions[:5]:
        lines.append(f"  region {region['name']}: {_spread(region['time_us'])} ms "
                     f"over {region['ranks']} rank(s)")
    for r in w.readiness:
        who = f" (ranks {_ranks(r['ranks'])})" if r["ranks"] else ""
        lines.append(f"  readiness: {r['code']}: {r['message']}{who}")
    if w.hta:
        lines += ["  " + line for line in hta_text(w.hta)]
    return lines


def _gbps(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g} GB/s"


def calls_text(found: Mapping[str, Any] | None) -> list[str]:
    """A window's collective calls matched across its ranks, in words: the late rank and
    why, each rank's wait and transfer, the groups by bus bandwidth."""
    if not found:
        return []
    calls = found["calls"]
    lines = [f"  collectives: {calls['matched']} of {calls['listed']} calls matched across "
             f"ranks by (group, number)"
             + (f"; {found['clock']['text']}" if found["clock"].get("offsets") == "none"
                else f"; clocks brought to rank 0's (uncertainty up to "
                     f"{ms(found['clock'].get('uncertainty_us'))} ms)")]
    late = found["late"]
    if late.get("rank") is not None:
        cause = (late.get("cause") or {}).get("text", "")
        lines.append(f"    LATE RANK: rank {late['rank']} arrived last in {late['votes']} "
                     f"of {late['calls']} calls (p = {late['p_value']:.2g}, "
                     f"{late['ranks_tested']} ranks tested){'; ' + cause if cause else ''}")
    elif late.get("cause"):
        lines.append(f"    {late['cause']['text']}")
    else:
        lines.append("    no rank arrived late more often than chance")
    ranks = found["ranks"]
    shown = sorted(ranks, key=lambda r: -(ranks[r]["wait_us"] or 0))
    if len(shown) > RANK_ROWS:
        shown = shown[:SLOWEST] + sorted(shown, key=lambda r: -ranks[r]["last"])[:1]
    lines.append("    rank   wait ms    transfer ms   arrived last   (per step: wait / "
                 "transfer ms)" + (f"   ({len(shown)} of {len(ranks)} ranks: the longest "
                                   "waits and the latest)" if len(ranks) > RANK_ROWS else ""))
    for rank in dict.fromkeys(shown):
        r = ranks[rank]
        per = (f"{ms(r.get('wait_per_step_us'))} / {ms(r.get('transfer_per_step_us'))}"
               if "wait_per_step_us" in r else "-")
        lines.append(f"    {rank:<6} {ms(r['wait_us']):<10} {ms(r['transfer_us']):<13} "
                     f"{r['last']:<14} {per}")
    for g in found["groups"][:4]:
        lines.append(f"    group {g['name']!s} ({g['size'] or '?'} ranks): {g['calls']} calls, "
                     f"{g['bytes']:,} bytes, bus bandwidth {_gbps(g['busbw_gbps'])} "
                     f"(median; algbw {_gbps(g['algbw_gbps'])})")
    if len(found["groups"]) > 1:
        lines.append(f"    slowest group: {found['slowest_group']}")
    lines += [f"    note: {p}" for p in found.get("problems") or ()]
    return lines


def _median(found: Mapping[TimelineFigure, Mapping[str, float] | None] | None,
            key: TimelineFigure) -> str:
    spread = found.get(key) if found else None
    return ms(spread["median"]) if spread else "-"


#: What the two views' idle means, said under a window that has both.
VIEWS = ("step view: a step's wall time on the host and what the device did in it (idle: "
         "the device waiting on the host); device view: TraceLens's gpu_timeline over the "
         "kernels a step launched, in its window on the device (idle: gaps between them). "
         "docs/analysis.md#definitions")


def device_lines(timeline: Mapping[TimelineFigure, Mapping[str, float] | None] | None,
                 ranks: int) -> list[str]:
    """The device view of a window across its ranks, and what it means."""
    if not timeline:
        return []
    labels: tuple[tuple[TimelineFigure, str], ...] = (
        ("computation_us", "computation"), ("exposed_comm_us", "exposed comm"),
        ("exposed_memcpy_us", "exposed memcpy"), ("busy_us", "busy"), ("idle_us", "idle"),
        ("total_us", "total"))
    said = ", ".join(f"{label} {_median(timeline, key)}" for key, label in labels)
    across = " (median across ranks)" if ranks > 1 else ""
    return [f"  device view, whole trace{across}, ms: {said}", f"  ({VIEWS})"]


def hta_text(hta: HtaAnswer) -> list[str]:
    if hta.get("error"):
        return [f"HTA: {hta['error']}"]
    lines = ["HTA temporal breakdown (ms): rank  compute  non-compute  idle  "
             "comm/comp overlap %"]
    for row in hta.get("ranks") or []:
        lines.append(f"  {row['rank']!s:<6} {ms(row.get('compute_us')):<8} "
                     f"{ms(row.get('non_compute_us')):<12} {ms(row.get('idle_us')):<6} "
                     f"{row.get('overlap_pct', '-')}")
    return lines


def render(result: RunAnalysis) -> str:
    lines: list[str] = []
    if result.stalls is not None:  # a hung job's answer comes first
        lines += stalls_text(result.stalls.to_json())
    for w in result.windows:
        lines += window_text(w)
        lines.append("")
    for n in result.notes:
        lines.append(f"note: {n['role']} rank {n['rank']}: {n['message']}")
    for p in result.problems:
        lines.append(f"warning: {p}")
    named = sum(1 for w in result.windows if w.straggler)
    lines.append(f"{len(result.windows)} window(s) analysed; {named} name a straggler")
    # Each line printable: manifest text is untrusted, no escape sequence reaches the terminal.
    return "\n".join(map(printable, lines))
