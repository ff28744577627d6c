"""The memory plot's chart: allocated and reserved bytes over time as inline SVG.

Standard library only, and no knowledge of snapshots: :mod:`.plot` replays those and hands
this the series. Long series are thinned per pixel column (first, lowest, highest and last
point of each), so a trace of a million entries draws the same shape in bounded size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from policy_engine.language.values.sizes import UNITS, byte_unit, human_bytes

# The picture, and the plot area inside it.
_W, _H = 960, 390
_LEFT, _TOP, _PW, _PH = 80, 20, 860, 310
_ALLOCATED, _RESERVED, _MARK = "#2a6fb8", "#e8862a", "#c00"


def _time_unit(us: float) -> tuple[str, float]:
    return ("s", 1e6) if abs(us) >= 1e6 else ("ms", 1e3) if abs(us) >= 1e3 else ("us", 1.0)


def human_time(us: float) -> str:
    """Microseconds, readably: 2500 -> '2.5 ms'."""
    unit, scale = _time_unit(us)
    return f"{us / scale:.4g} {unit}"


def _ticks(hi: float, target: int) -> list[float]:
    """About ``target`` round values (1, 2 or 5 times a power of ten apart) from 0 to ``hi``."""
    if hi <= 0:
        return [0.0]
    raw = hi / target
    exp = 10.0 ** math.floor(math.log10(raw))
    step = next(m * exp for m in (1, 2, 5, 10) if m * exp >= raw)
    return [k * step for k in range(int(hi / step + 1e-9) + 1)]


def thin(xs: Sequence[int], ys: Sequence[int], columns: int) -> list[int]:
    """The indices of the points worth drawing: all of them when few, else per column of
    the x range its first, lowest, highest and last point (at most 4 * ``columns``)."""
    if len(xs) <= 4 * columns:
        return list(range(len(xs)))
    lo, span = xs[0], (xs[-1] - xs[0]) or 1
    kept: dict[int, list[int]] = {}  # column -> [first, lowest, highest, last]
    for i, (t, v) in enumerate(zip(xs, ys, strict=True)):
        col = kept.setdefault(min(columns - 1, max(0, (t - lo) * columns // span)), [i] * 4)
        if v < ys[col[1]]:
            col[1] = i
        if v > ys[col[2]]:
            col[2] = i
        col[3] = i
    return sorted({i for col in kept.values() for i in col})


def chart(times: Sequence[int], allocated: Sequence[int], reserved: Sequence[int], *,
          in_us: bool, peak: tuple[int, int],
          ooms: Sequence[tuple[int, int, int | None]] = ()) -> str:
    """An ``<svg>`` element: the two series as steps over ``times`` (microseconds when
    ``in_us``, else entry numbers), a marker at ``peak`` (time, bytes) and a dashed line
    at each of ``ooms`` (time, bytes asked, bytes free or None)."""
    t0, base = min(times), _TOP + _PH  # should a clock ever run backwards
    span = max(max(times) - t0, 1)
    top = max(max(allocated), max(reserved), 1)
    k = byte_unit(top)
    yticks = _ticks(top / 1024 ** k, 5)
    ytop = max(yticks[-1] * 1024 ** k, top) * 1.05

    def x(t: float) -> str:
        return f"{_LEFT + (t - t0) * _PW / span:.1f}"

    def y(v: float) -> str:
        return f"{_TOP + _PH - v * _PH / ytop:.1f}"

    out = [f'<svg width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" font-size="12" '
           'font-family="sans-serif">',
           f'<rect x="{_LEFT}" y="{_TOP}" width="{_PW}" height="{_PH}" fill="#fafafa" '
           'stroke="#bbb"/>']
    for v in yticks:
        at = y(v * 1024 ** k)
        out.append(f'<line x1="{_LEFT}" x2="{_LEFT + _PW}" y1="{at}" y2="{at}" '
                   f'stroke="#e4e4e4"/><text x="{_LEFT - 6}" y="{at}" dy="4" '
                   f'text-anchor="end">{v:g} {UNITS[k]}</text>')
    unit, scale = _time_unit(span) if in_us else ("", 1.0)
    for v in _ticks(span / scale, 8) if len(times) > 1 else ():
        at = x(t0 + v * scale)
        out.append(f'<line x1="{at}" x2="{at}" y1="{base}" y2="{base + 5}" stroke="#888"/>'
                   f'<text x="{at}" y="{base + 18}" text-anchor="middle">{v:g}</text>')
    label = ("the state at the dump" if len(times) == 1
             else f"time since the first trace entry ({unit})" if in_us else "trace entry")
    out.append(f'<text x="{_LEFT + _PW // 2}" y="{base + 36}" text-anchor="middle">'
               f'{label}</text>')
    out.append(f'<text x="{_LEFT}" y="{_H - 4}" fill="{_ALLOCATED}">allocated</text>'
               f'<text x="{_LEFT + 80}" y="{_H - 4}" fill="{_RESERVED}">reserved</text>')
    for values, color, name in ((reserved, _RESERVED, "reserved"),
                                (allocated, _ALLOCATED, "allocated")):
        steps = "".join(f"H{x(times[i])}V{y(values[i])}" for i in thin(times, values, _PW)[1:])
        end = f"H{_LEFT + _PW}" if len(times) == 1 else ""  # one point: a level line
        out.append(f'<path d="M{x(times[0])},{y(values[0])}{steps}{end}" fill="none" '
                   f'stroke="{color}" stroke-width="1.5"><title>{name}</title></path>')
    for when, asked, free in ooms:
        at, right = x(when), float(x(when)) > _LEFT + _PW * 0.9
        left = "" if free is None else f", {human_bytes(free)} free"
        out.append(f'<g fill="{_MARK}"><title>out of memory asking for {human_bytes(asked)}'
                   f'{left}</title><line x1="{at}" x2="{at}" y1="{_TOP}" y2="{base}" '
                   f'stroke="{_MARK}" stroke-dasharray="4 3"/><text x="{at}" '
                   f'dx="{-3 if right else 3}" y="{base - 6}" '
                   f'text-anchor="{"end" if right else "start"}">OOM</text></g>')
    px, py = x(peak[0]), y(peak[1])
    right = float(px) > _LEFT + _PW * 0.7  # the label goes on the side with room
    out.append(f'<g fill="{_MARK}"><title>peak allocated</title>'
               f'<circle cx="{px}" cy="{py}" r="4"/><text x="{px}" dx="{-8 if right else 8}" '
               f'y="{max(float(py) - 6, _TOP + 12):.1f}" '
               f'text-anchor="{"end" if right else "start"}">peak {human_bytes(peak[1])}</text>'
               "</g>")
    out.append("</svg>")
    return "\n".join(out)
