"""Byte sizes as people read them: the unit ladder every printed size climbs.

Low in the package so that the backends (the memory plot) and the CLI (tables, forecasts)
print sizes in the same units; the policy's own sizes (``limits.bytes: 2GiB``) are parsed
where they are declared.
"""

from __future__ import annotations

from policy_engine.errors import is_int

#: Binary units, smallest first: each is 1024 of the one before.
UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def byte_unit(n: float) -> int:
    """The index in :data:`UNITS` of the largest unit not above ``n`` (TiB at most)."""
    return min(len(UNITS) - 1, max(0, (int(abs(n)).bit_length() - 1) // 10))


def human_bytes(n: float) -> str:
    """Bytes to four significant digits: 1536 -> '1.5 KiB', 5 << 40 -> '5 TiB'."""
    k = byte_unit(n)
    return f"{n / 1024 ** k:.4g} {UNITS[k]}"


def size_cell(n: object) -> str:
    """Bytes as tables and summaries show them: '512 B', '1.5 KiB', '2.0 TiB' (one
    decimal past bytes); '-' for what is not a number of bytes."""
    if not is_int(n):
        return "-"
    if n < 1024:
        return f"{n} B"
    k = byte_unit(n)
    return f"{n / 1024 ** k:.1f} {UNITS[k]}"
