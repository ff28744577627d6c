"""The ranks of an analysis, written aside as they are read, so that none is held.

``analyze`` reads each rank's summary once, adds it to its window's figures
(:class:`~policy_engine.analysis.window.Figures`), and writes it here as one line of JSON,
to an unnamed temporary file (gone when the analysis is, or when the process ends). A
window's ranks are then handed out again in rank order (:class:`RankView`), as JSON text
for the document ``analyze --format json`` prints, or parsed, without reading a manifest
or a trace again. What stays in memory per rank is its place in the file.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any, overload

if TYPE_CHECKING:
    from policy_engine.analysis.summary import RankEntry

try:
    import orjson
except ImportError:  # pragma: no cover - a dependency; the standard library does the same
    orjson = None  # type: ignore[assignment]


def dumps(value: Any) -> bytes:
    """``value`` as compact JSON (orjson's encoder where it takes the value)."""
    if orjson is not None:
        try:
            return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
        except (TypeError, ValueError):
            pass
    return json.dumps(value, separators=(",", ":")).encode("utf-8")


def dumps_sorted(value: Any) -> str:
    """``value`` as JSON text with its keys sorted (one text for one value)."""
    if orjson is not None:
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode("utf-8")
        except (TypeError, ValueError):
            pass
    return json.dumps(value, sort_keys=True, default=str)


def loads(data: bytes) -> Any:
    return orjson.loads(data) if orjson is not None else json.loads(data)


def _order(rank: Any) -> tuple[bool, Any]:
    return (not isinstance(rank, int), rank if isinstance(rank, int) else 0)


class Spool:
    """An append-only file of JSON lines, one per rank, and where each lies."""

    def __init__(self) -> None:
        self._file: IO[bytes] | None = None
        self._end = 0
        self._lock = threading.Lock()

    def add(self, doc: RankEntry) -> tuple[int, int]:
        """Write ``doc``; where it lies (offset, length)."""
        data = dumps(doc)
        with self._lock:
            if self._file is None:
                # held open for the analysis's life: close() ends it
                self._file = tempfile.TemporaryFile(  # noqa: SIM115
                    prefix="policy-engine-analysis-")
            self._file.seek(self._end)
            self._file.write(data)
            offset, self._end = self._end, self._end + len(data)
        return offset, len(data)

    def read(self, offset: int, length: int) -> bytes:
        with self._lock:
            assert self._file is not None
            self._file.flush()
            return os.pread(self._file.fileno(), length, offset)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class Places:
    """Where each rank's line lies in a spool, in the order added: its rank, offset and
    length, held as columns (a window of 100,000 ranks holds no object a rank but its
    rank)."""

    def __init__(self, places: Iterable[tuple[Any, int, int]] = ()) -> None:
        self.ranks: list[Any] = []
        self.offsets, self.lengths = array("q"), array("q")
        for place in places:
            self.append(*place)

    def append(self, rank: Any, offset: int, length: int) -> None:
        self.ranks.append(rank)
        self.offsets.append(offset)
        self.lengths.append(length)

    def __len__(self) -> int:
        return len(self.ranks)

    def __getitem__(self, i: int) -> tuple[Any, int, int]:
        return self.ranks[i], self.offsets[i], self.lengths[i]

    def __iter__(self) -> Iterator[tuple[Any, int, int]]:
        return zip(self.ranks, self.offsets, self.lengths, strict=True)

    def in_rank_order(self) -> Places:
        """The places sorted by rank (ranks that are no number last), stably."""
        ranks = self.ranks
        if all(type(r) is int for r in ranks):
            order = sorted(range(len(ranks)), key=ranks.__getitem__)
        else:
            order = sorted(range(len(ranks)), key=lambda i: _order(ranks[i]))
        out = Places()
        out.ranks = [ranks[i] for i in order]
        out.offsets = array("q", [self.offsets[i] for i in order])
        out.lengths = array("q", [self.lengths[i] for i in order])
        return out


class RankView(Sequence["RankEntry"]):
    """A window's ranks, in rank order, read back from the spool: a sequence of the
    ranks' JSON objects (each read and parsed when asked for)."""

    def __init__(self, spool: Spool | None, places: Iterable[tuple[Any, int, int]]) -> None:
        self._spool = spool
        self._places = (places if isinstance(places, Places) else Places(places)
                        ).in_rank_order()

    @classmethod
    def of(cls, docs: list[RankEntry]) -> RankView:
        """A view of ``docs`` (held in a spool of their own)."""
        spool = Spool()
        return cls(spool, [(d.get("rank"), *spool.add(d)) for d in docs])

    def __len__(self) -> int:
        return len(self._places)

    @overload
    def __getitem__(self, index: int) -> RankEntry: ...
    @overload
    def __getitem__(self, index: slice) -> list[RankEntry]: ...

    def __getitem__(self, index: int | slice) -> Any:
        places = self._places
        if isinstance(index, slice):
            return [self._load(places[i]) for i in range(len(places))[index]]
        if index < 0:
            index += len(places)
        if not 0 <= index < len(places):
            raise IndexError("rank view index out of range")
        return self._load(places[index])

    def __iter__(self) -> Iterator[RankEntry]:
        for place in self._places:
            yield self._load(place)

    def raw(self) -> Iterator[bytes]:
        """Each rank as its JSON text."""
        assert self._spool is not None or not len(self._places)
        for _rank, offset, length in self._places:
            yield self._spool.read(offset, length)  # type: ignore[union-attr]

    def _load(self, place: tuple[Any, int, int]) -> RankEntry:
        assert self._spool is not None
        found: RankEntry = loads(self._spool.read(place[1], place[2]))
        return found

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RankView):
            return list(self) == list(other)
        if isinstance(other, list):
            return list(self) == other
        return NotImplemented

    def __repr__(self) -> str:
        return f"RankView({len(self)} ranks)"
