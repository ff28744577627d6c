"""The shape of YAML (and JSON) text, bounded before PyYAML composes it.

Composing recurses once per nesting level, and libyaml's composer (PyYAML's C loader)
does so with no guard: tens of thousands of levels overflow the C stack and kill the
process (PyYAML 6.0.3 and older). So the nesting and the number of values are bounded
first, from the parse events, which keep their state in lists, not on the call stack.

Every collection the parser opens starts at an indicator character of its own: `[`,
`{`, the `-` of its first entry, or the `?` or `:` of its first key. So the number of
these characters bounds the nesting from above, and a text holds at most about two
values per character. Texts within both bounds (every policy of a few lines) need no
walk; the others are walked event by event.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.events import CollectionEndEvent, CollectionStartEvent, Event, NodeEvent

from policy_engine.errors import Location, PolicyError, json_path
from policy_engine.language.read.document import MAX_DEPTH, MAX_NODES, TOO_MANY, PathKey, too_deep

#: The characters that open a collection (see above).
OPENERS = "[{-?:"


def check_shape(text: str, origin: str, loader_class: type[Any]) -> None:
    """Refuse nesting beyond MAX_DEPTH and more than MAX_NODES values before composing.

    Parsers keep their state in lists, not on the call stack, so walking the events is
    safe at any depth; the walk stops at the first node past a limit, which is where
    the error points. Short, shallow texts need no walk (see ``OPENERS``).
    ``loader_class`` is the PyYAML loader that will compose the text.
    """
    if _short_and_shallow(text):
        return
    try:
        walk_events(loader_class, text, origin)
    except yaml.MarkedYAMLError as exc:
        if loader_class is yaml.SafeLoader or "maximum nesting depth" not in (exc.problem or ""):
            raise
        # Newer libyaml stops at 1000 levels of its own while it reads ahead; the
        # pure-Python parser reads lazily and finds where our limit is crossed.
        walk_events(yaml.SafeLoader, text, origin)
        raise


def _short_and_shallow(text: str) -> bool:
    """Whether ``text`` is surely within both limits (see ``OPENERS``)."""
    return sum(map(text.count, OPENERS)) <= MAX_DEPTH and 2 * len(text) < MAX_NODES


class _Open:
    """A collection being walked: its start event, its path, and where in it we are."""

    def __init__(self, event: Event, path: PathKey, mapping: bool) -> None:
        self.event, self.path, self.mapping = event, path, mapping
        self.index = 0  # items seen (keys and values alike in a mapping)
        self.key: str | None = None  # the scalar key whose value comes next

    def child_path(self) -> PathKey:
        if not self.mapping:
            return (*self.path, self.index)
        return self.path if self.key is None else (*self.path, self.key)

    def done(self, event: Event) -> None:
        """A child (scalar, alias or closed collection) is complete."""
        if self.mapping and self.index % 2 == 0 and isinstance(event, yaml.ScalarEvent):
            self.key = event.value
        self.index += 1
        if self.mapping and self.index % 2 == 0:
            self.key = None


def walk_events(loader_class: type[Any], text: str, origin: str) -> None:
    """Walk ``text``'s parse events, refusing the first node past MAX_DEPTH or MAX_NODES."""
    loader = loader_class(text)
    try:
        stack: list[_Open] = []
        nodes = 0
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, CollectionEndEvent):
                closed = stack.pop()
                if stack:
                    stack[-1].done(closed.event)
                continue
            if not isinstance(event, NodeEvent):
                continue
            path = stack[-1].child_path() if stack else ()
            nodes += 1
            if nodes > MAX_NODES:
                where = stack[-1] if stack else None
                raise PolicyError.single(
                    TOO_MANY,
                    _mark(where.event if where else event, origin),
                    json_path(where.path if where else path),
                )
            if isinstance(event, CollectionStartEvent):
                if len(stack) >= MAX_DEPTH:
                    raise too_deep(_mark(event, origin), path)
                stack.append(_Open(event, path, not isinstance(event, yaml.SequenceStartEvent)))
            elif stack:
                stack[-1].done(event)
    finally:
        loader.dispose()


def _mark(event: Event, origin: str) -> Location:
    mark = event.start_mark
    return Location(origin, mark.line + 1, mark.column + 1) if mark else Location(origin)
