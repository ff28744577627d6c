"""policy-engine traces DIR: every capture the manifests under DIR record, as one table.

Also flags files on disk that no manifest names, and manifest entries whose file is gone.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..runtime.manifest import MANIFEST_DIR, read_manifests
from ._common import add_format_option, print_json
from .main import UsageError

# Folders written whole by a tool (torch_npu) are one trace, not many files.
_TRACE_DIR_SUFFIXES = ("_ascend_pt",)


def add_parser(sub: Any, name: str) -> None:
    parser = sub.add_parser(name, help="list the traces under a folder", description=__doc__)
    parser.add_argument("dir", metavar="DIR")
    add_format_option(parser)
    parser.set_defaults(run=run)


def _on_disk(root: str) -> set[str]:
    found: set[str] = set()
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        if rel.split(os.sep)[0] == MANIFEST_DIR:
            dirs[:] = []
            continue
        for d in list(dirs):
            if d.endswith(_TRACE_DIR_SUFFIXES):
                found.add(os.path.normpath(os.path.join(rel, d)))
                dirs.remove(d)
        found.update(os.path.normpath(os.path.join(rel, f)) for f in files
                     if not f.startswith("."))
    return found


def collect(root: str) -> dict[str, Any]:
    """Rows from every manifest under ``root``, unlisted files, missing files."""
    rows: list[dict[str, Any]] = []
    named: set[str] = set()
    for record in read_manifests(root):
        base = os.path.dirname(os.path.dirname(record.pop("_manifest")))
        path = record.get("path")
        if path:
            full = os.path.normpath(os.path.join(base, path))
            rel = os.path.relpath(full, root)
            record["path"] = rel
            record["exists"] = os.path.exists(full)
            named.add(rel)
        rows.append(record)
    rows.sort(key=lambda r: (str(r.get("role")), r.get("rank", 0), r.get("start") or 0))
    unlisted = sorted(_on_disk(root) - named)
    missing = sorted(r["path"] for r in rows if r.get("path") and not r.get("exists"))
    return {"traces": rows, "unlisted": unlisted, "missing": missing}


def _size(n: Any) -> str:
    if not isinstance(n, int):
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _steps(record: dict[str, Any]) -> str:
    steps = record.get("steps") or []
    if not steps:
        return "-"
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"


def run(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.dir):
        raise UsageError(f"{args.dir} is not a folder")
    data = collect(args.dir)
    if args.format == "json":
        print_json(data)
        return 0
    header = ("ROLE", "REGION", "RANK", "STEPS", "CYCLE", "STATUS", "SIZE", "PATH")
    table = [header] + [
        ("+".join([str(r.get("role")), *r.get("joined", [])]),
         r.get("region") or "-", str(r.get("rank")), _steps(r),
         "-" if r.get("cycle") is None else str(r["cycle"]), str(r.get("status")),
         _size(r.get("bytes")), r.get("path") or f"({r.get('error', 'no file')})")
        for r in data["traces"]
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1])
    statuses: dict[str, int] = {}
    for r in data["traces"]:
        statuses[str(r.get("status"))] = statuses.get(str(r.get("status")), 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))
    print(f"{len(data['traces'])} captures ({summary or 'none'})")
    for path in data["unlisted"]:
        print(f"unlisted: {path} (on disk, but no manifest names it)")
    for path in data["missing"]:
        print(f"missing: {path} (a manifest names it, but it is not on disk)")
    return 0
