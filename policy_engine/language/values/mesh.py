"""The policy's ``mesh``: parallel dimensions, and how a rank number maps onto them."""

from __future__ import annotations

from collections.abc import Mapping

#: Parallel dimensions a mesh may name, and the order used when rendering names.
DIMS: tuple[str, ...] = ("tp", "pp", "dp", "cp", "ep")


def coords_from_mesh(rank: int, mesh: Mapping[str, int]) -> dict[str, int]:
    """Coordinates of ``rank`` in ``mesh`` (outermost dimension first, last varies fastest).

    >>> coords_from_mesh(5, {"pp": 2, "dp": 2, "tp": 2})
    {'pp': 1, 'dp': 0, 'tp': 1}
    """
    out: dict[str, int] = {}
    rest = rank
    for dim, size in reversed(list(mesh.items())):
        out[dim] = rest % size
        rest //= size
    return {dim: out[dim] for dim in mesh}


def effective_mesh(cli: Mapping[str, int] | None, own: Mapping[str, int] | None,
                   top: Mapping[str, int] | None) -> Mapping[str, int]:
    """The mesh that places a role's ranks: the CLI's ``--mesh``, else the role's own
    (``roles.<name>.mesh``, else ``defaults.mesh``), else the top-level ``mesh``; empty when
    there is none. A mesh replaces, never merges: dimensions are in order."""
    return cli or own or top or {}


def mesh_size(mesh: Mapping[str, int]) -> int:
    total = 1
    for size in mesh.values():
        total *= size
    return total


def format_mesh(mesh: Mapping[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in mesh.items())


def parse_mesh(text: str) -> dict[str, int]:
    """Parse ``pp=2,dp=2,tp=2`` (CLI form). Raises ValueError naming the bad part."""
    mesh: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, size = part.partition("=")
        name = name.strip()
        if not sep or name not in DIMS or not size.strip().isdigit() or int(size) < 1:
            raise ValueError(
                f"bad mesh entry {part!r}: expected DIM=SIZE with DIM one of {', '.join(DIMS)}"
            )
        if name in mesh:
            raise ValueError(f"mesh names {name!r} twice")
        mesh[name] = int(size)
    if not mesh:
        raise ValueError("empty mesh")
    return mesh
