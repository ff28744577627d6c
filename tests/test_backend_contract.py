"""The backend contract (policy_engine.backends.base.Session) and the registry that names
each backend's settings, session and file endings (policy_engine.backends.REGISTRY)."""

from __future__ import annotations

import inspect
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import architecture_rules
import pytest

from policy_engine import settings
from policy_engine.backends import REGISTRY, SESSIONS, create
from policy_engine.backends.base import Artifact, Session
from policy_engine.backends.combined import Combined, CombinedSession
from policy_engine.backends.files import name_files
from policy_engine.testing import RecordingBackend, RecordingSession

#: The hooks a session must define; every other one has a default.
REQUIRED = {"prepare", "start", "step", "save", "discard", "range", "close"}


class Bare(Session):
    """A session that defines the required hooks only."""

    def __init__(self) -> None:
        self.saved: list[tuple[str, int]] = []

    def prepare(self) -> None: ...
    def start(self) -> None: ...
    def step(self, inner_step: int) -> None: ...
    def discard(self) -> None: ...
    def close(self) -> None: ...

    def range(self, name: str) -> AbstractContextManager[object]:
        return nullcontext()

    def save(self, stem: str, cycle: int) -> list[Artifact]:
        self.saved.append((stem, cycle))
        return [Artifact(f"{stem}.bare", 1)]


def _hooks() -> set[str]:
    return {name for name in vars(Session) if not name.startswith("_")}


def _defaults(name: str) -> dict[str, Any]:
    block = settings.settings_schema(name)["properties"]
    return {key: spec["default"] for key, spec in block.items() if "default" in spec}


def test_the_registry_has_one_entry_per_backend_name() -> None:
    assert list(REGISTRY) == list(settings.BACKENDS)
    assert all(entry.name == name for name, entry in REGISTRY.items())
    assert {name: entry.session for name, entry in REGISTRY.items()} == SESSIONS
    for entry in REGISTRY.values():
        module = settings.checks(entry.name)
        assert module.__name__ == entry.settings
        assert callable(module.check_settings) and callable(module.check_runtime)
        assert isinstance(module.SETTINGS, dict) and entry.endings


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_registered_session_subclasses_session(name: str) -> None:
    backend = REGISTRY[name].backend_class()
    assert backend.name == name
    assert type(create(name)) is backend
    if name in settings.ENGINES:
        assert backend.session is None  # the engine driver records, not a worker session
        return
    assert issubclass(backend.session, Session)
    assert inspect.signature(backend.open).return_annotation in (
        backend.session.__name__, backend.session)


def test_the_other_sessions_subclass_session_too() -> None:
    assert issubclass(CombinedSession, Session) and Combined.session is CombinedSession
    assert issubclass(RecordingSession, Session)
    assert RecordingBackend.session is RecordingSession


def test_the_hooks_are_listed_once() -> None:
    assert _hooks() == set(architecture_rules.SESSION_HOOKS)
    assert set(Session.__abstractmethods__) == REQUIRED
    with pytest.raises(TypeError):
        Session()  # type: ignore[abstract]


def test_the_optional_hooks_do_nothing() -> None:
    session = Bare()
    before = dict(vars(session))
    assert session.any_thread is False and session.saves_later is False
    session.set_reporter(lambda artifact, status: None, lambda: "x")
    session.set_stem("name")
    session.note({"roles": ["actor"], "inner_steps": [0]})
    assert vars(session) == before and session.saved == []


def test_save_later_saves_at_once_by_default() -> None:
    session = Bare()
    write = session.save_later("a/x", 2)
    assert session.saved == [("a/x", 2)]  # written now, on the capture's thread
    assert write() == [Artifact("a/x.bare", 1)] and session.saved == [("a/x", 2)]


def test_who_saves_later() -> None:
    later = {name for name in REGISTRY if name not in settings.ENGINES
             and REGISTRY[name].backend_class().session.saves_later}
    assert later == {"torch"}
    assert CombinedSession.saves_later  # stops each part now, writes what is left after


@pytest.mark.parametrize(("name", "extra"), [
    ("torch", {"gzip": True}), ("torch", {"gzip": False}),
    ("memory", {"on_oom": True, "history": "always"}), ("memory", {"on_oom": False}),
    ("mstx", {}), ("nsight", {}), ("nsight", {"output": "out/run_%p"}),
])
def test_the_files_a_backend_names_take_its_endings(name: str, extra: dict[str, Any]) -> None:
    found = name_files(name, {**_defaults(name), **extra}, "out", "a/x_step1", 0)
    assert found and all(f["path"].endswith(REGISTRY[name].endings) for f in found), found
