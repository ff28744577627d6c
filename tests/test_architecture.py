"""The layout the code promises (docs/architecture.md), checked on the source itself.

    errors  <-  settings  <-  files  <-  language  <-  plan  <-  backends  <-  analysis
            <-  runtime  <-  integrations  <-  cli

A package imports only from those to its left: the language asks the registry in
``settings`` about backends and never imports ``backends``; the reading side
(``analysis``) sits below the runtime, which summarises its own captures with it, and the
command line only parses arguments and prints what it computes. No import cycle, counting
imports inside functions, under ``if TYPE_CHECKING:`` and modules named to importlib (the
registry's strings). The language and the runtime keep their own sub-package orders.
No module over 650 lines, bar the named waivers. Each fact at the edges has one home: one
module publishes files, one parses ``traceEvents``, one builds manifest lines, one writes a
capture's lines (the manifest lifecycle), one checks that a parsed value is an integer;
a status is named by its member, not spelled as a string; no runtime value has two names
and nothing reaches into the process state's one-time record; no private name crosses a
package or is left unused; no module of the language or the runtime is a mixin (a class of
stub methods another class fills in) or hands on names it imports (a re-export); no
module of the runtime or the backends probes a session for a hook (``getattr``): every
session subclasses ``backends.base.Session``, whose optional hooks do nothing. The public
analysis API hands on typed answers (records, or JSON documents declared as TypedDicts),
never a ``dict[str, Any]`` (a record's ``to_json`` aside), and the reading side holds no
more of them than the ratchet ``MOST_UNTYPED``.
Each rule is shown to catch a planted violation (tests/architecture_rules.py holds them).
"""

from __future__ import annotations

import ast
from pathlib import Path

import architecture_rules as rules
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "policy_engine"
#: A module a reader can hold in mind at once. Longer ones are waived by name, with why.
MAX_LINES = 650
WAIVERS: dict[str, str] = {
    # None today. Add "policy_engine/x/y.py": "why splitting it would cut a concept in two".
}
LAYERS = ["errors", "_resources", "settings", "files", "language", "plan", "backends",
          "analysis", "runtime", "testing", "integrations", "cli"]
#: The language's own order: each part imports only those before it.
LANGUAGE = ["values", "read", "schema", "model", "rules", "load"]
# runtime/ by concept: capture and triggers do not import each other
RUNTIME = ["process", "capture", "triggers", "role", "apply"]
TOP_LEVEL = {"__init__.py", "__main__.py", "errors.py", "testing.py", "_resources.py"}
PACKAGES = {"settings", "files", "language", "plan", "backends", "analysis", "runtime",
            "integrations", "cli"}
#: The one home of each fact at the edges.
PUBLISHER = "policy_engine.files.publish"
TRACE_READER = "policy_engine.analysis.chrome_trace"
RECORD_BUILDER = "policy_engine.files.records"
LIFECYCLE = "policy_engine.runtime.capture.lines"
#: At most this many ``dict[str, Any]`` in analysis/ (a ratchet: lower it as they go).
MOST_UNTYPED = 23

MODULES = rules.modules_under(ROOT, "policy_engine")
TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}
GRAPH = {name: rules.imports(TREES[name], name, MODULES[name], MODULES) for name in MODULES}


def _offenders(check: object, *, skip: str | None = None) -> dict[str, list[str]]:
    found = {name: check(TREES[name]) for name in sorted(MODULES)  # type: ignore[operator]
             if name != skip}
    return {name: where for name, where in found.items() if where}


# ------------------------------------------------------------------- the rules, on the code

def test_no_import_cycles() -> None:
    assert rules.cycles(GRAPH) == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_down_the_layers(name: str) -> None:
    assert rules.upward({name: GRAPH[name]}, LAYERS) == []


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.name)
def test_modules_fit_in_one_sitting(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    waived = path.relative_to(path.parents[len(path.parents) - 1]).as_posix()
    assert lines <= MAX_LINES or any(waived.endswith(w) for w in WAIVERS), \
        f"{path.name}: {lines} lines"


def test_every_waiver_names_a_module_and_says_why() -> None:
    for path, why in WAIVERS.items():
        assert (ROOT / path).is_file() and why.strip(), path


def test_the_top_level_holds_the_entry_points_only() -> None:
    assert {p.name for p in PACKAGE.glob("*.py")} == TOP_LEVEL
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"} \
        == PACKAGES
    # a folder without __init__.py would be a namespace package: not packaged, not checked
    assert [p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__"
            and not (p / "__init__.py").exists()] == []


def test_the_language_parts_import_down_their_order() -> None:
    inside = {name: {dep for dep in deps if rules.layer(dep) == "language"}
              for name, deps in GRAPH.items() if rules.layer(name) == "language"}
    assert {rules.layer(name, 2) for name in inside} == set(LANGUAGE) | {"__init__"}
    assert rules.upward(inside, LANGUAGE, depth=2) == []


def test_the_runtime_parts_import_down_their_order() -> None:
    inside = {name: {dep for dep in deps if rules.layer(dep) == "runtime"}
              for name, deps in GRAPH.items() if rules.layer(name) == "runtime"}
    assert {rules.layer(name, 2) for name in inside} == set(RUNTIME) | {"__init__"}
    assert rules.upward(inside, RUNTIME, depth=2) == []
    capture = {n for n in inside if rules.layer(n, 2) == "capture"}
    triggers = {n for n in inside if rules.layer(n, 2) == "triggers"}
    assert {(n, d) for n in capture | triggers for d in inside[n]
            if rules.layer(d, 2) in ("capture", "triggers")
            and rules.layer(d, 2) != rules.layer(n, 2)} == set()


def test_settings_import_nothing_above_them() -> None:
    above = {dep for name, deps in GRAPH.items() if rules.layer(name) == "settings"
             for dep in deps if rules.layer(dep) not in ("settings", "errors")}
    assert above == set()


def test_one_module_publishes_files() -> None:
    assert _offenders(rules.publishing, skip=PUBLISHER) == {}


def test_one_module_parses_trace_events() -> None:
    assert _offenders(rules.trace_parsing, skip=TRACE_READER) == {}


def test_manifest_lines_are_built_in_one_module() -> None:
    assert _offenders(rules.record_building, skip=RECORD_BUILDER) == {}


def test_every_capture_goes_through_one_manifest_lifecycle() -> None:
    found = {name: rules.lifecycle_lines(TREES[name]) for name in sorted(MODULES)
             if name not in (RECORD_BUILDER, LIFECYCLE)}
    assert {name: where for name, where in found.items() if where} == {}


def test_no_private_name_crosses_a_package() -> None:
    found = {name: rules.private_imports(TREES[name], name, MODULES[name], MODULES)
             for name in sorted(MODULES)}
    assert {name: where for name, where in found.items() if where} == {}


def test_the_reading_side_imports_nothing_above_it() -> None:
    above = {(name, dep) for name, deps in GRAPH.items() if rules.layer(name) == "analysis"
             for dep in deps if rules.layer(dep) in ("runtime", "integrations", "cli", "testing")}
    assert above == set()


def test_the_command_line_holds_no_analysis() -> None:
    found = {name: rules.analysis_outside(TREES[name]) for name in sorted(MODULES)
             if rules.layer(name) != "analysis"}
    assert {name: where for name, where in found.items() if where} == {}


def test_no_test_imports_a_private_name_of_the_reading_side() -> None:
    tests = sorted(Path(__file__).parent.rglob("*.py"))
    found = {p.name: rules.private_names_of(ast.parse(p.read_text()), "policy_engine.analysis")
             for p in tests}
    assert {name: where for name, where in found.items() if where} == {}


@pytest.mark.parametrize("rule", [rules.mixins, rules.reexports], ids=lambda r: r.__name__)
def test_no_language_or_runtime_module_is_a_mixin_or_a_reexport(rule: object) -> None:
    found = {name: rule(TREES[name]) for name in sorted(MODULES)  # type: ignore[operator]
             if rules.layer(name) in ("language", "runtime")}
    assert {name: where for name, where in found.items() if where} == {}


def test_no_session_hook_is_probed() -> None:
    found = {name: rules.session_probing(TREES[name]) for name in sorted(MODULES)
             if rules.layer(name) in ("runtime", "backends")}
    assert {name: where for name, where in found.items() if where} == {}


def test_an_int_not_a_bool_is_asked_of_one_helper() -> None:
    found = {name: rules.int_checks(TREES[name]) for name in sorted(MODULES)
             if name != "policy_engine.errors"}
    assert {name: where for name, where in found.items() if where} == {}


def test_no_private_name_is_left_unused() -> None:
    assert rules.unused_private_names(TREES, sorted(MODULES)) == {}


def test_a_status_is_named_by_its_member() -> None:
    found = {name: rules.status_strings(TREES[name]) for name in sorted(MODULES)
             if name != RECORD_BUILDER}
    assert {name: where for name, where in found.items() if where} == {}


def test_no_runtime_value_has_two_names() -> None:
    found = {name: rules.alias_properties(TREES[name]) for name in sorted(MODULES)
             if rules.layer(name) == "runtime"}
    assert {name: where for name, where in found.items() if where} == {}


def test_once_per_process_is_said_through_one_helper() -> None:
    # warn_once and warned keep the record of what was said; the process's lock is the
    # runtime's own, not something a plugin takes to write that record by hand.
    found = {name: rules.state_fields(TREES[name], [
        *(["warned"] if name != "policy_engine.runtime.process.state" else []),
        *(["lock"] if not name.startswith("policy_engine.runtime.process.") else [])])
        for name in sorted(MODULES)}
    assert {name: where for name, where in found.items() if where} == {}


def test_the_public_analysis_api_hands_on_typed_answers() -> None:
    homes = rules.public_homes(TREES["policy_engine.analysis"], "policy_engine.analysis")
    assert set(homes) <= set(MODULES)
    found = {module: rules.untyped_answers(TREES[module], names)
             for module, names in sorted(homes.items())}
    assert {name: where for name, where in found.items() if where} == {}


def test_the_reading_side_holds_few_untyped_answers() -> None:
    """A ratchet: the JSON objects the reading side still passes untyped (a record's
    ``to_json`` among them) stay at most this many."""
    count = sum(rules.UNTYPED in line for name in MODULES if rules.layer(name) == "analysis"
                for line in MODULES[name].read_text().splitlines())  # lines, as grep -c
    assert count <= MOST_UNTYPED, count


# ----------------------------------------------------- each rule catches a planted violation

def _package(tmp_path: Path, files: dict[str, str]) -> dict[str, set[str]]:
    for rel, text in files.items():
        path = tmp_path / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return rules.graph(rules.modules_under(tmp_path, "pkg"))


def test_a_cycle_closed_by_a_typing_import_is_caught(tmp_path: Path) -> None:
    edges = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n",
        "b.py": "def f():\n    from pkg.a import thing\n",
    })
    assert rules.cycles(edges) == [["pkg.a", "pkg.b"]]


def test_a_cycle_closed_by_a_registry_string_is_caught(tmp_path: Path) -> None:
    edges = _package(tmp_path, {
        "__init__.py": "",
        "registry.py": "import importlib\nMODULES = {'x': 'pkg.session'}\n"
                       "def load(n):\n    return importlib.import_module(MODULES[n])\n",
        "session.py": "from pkg import registry\n",
    })
    assert rules.cycles(edges) == [["pkg.registry", "pkg.session"]]


def test_an_upward_import_through_a_string_is_caught(tmp_path: Path) -> None:
    edges = _package(tmp_path, {
        "__init__.py": "",
        "settings/__init__.py": "SESSIONS = {'torch': 'pkg.backends.torch'}\n",
        "backends/__init__.py": "",
        "backends/torch.py": "from pkg import settings\n",
    })
    assert rules.upward(edges, LAYERS) == [("pkg.settings", "pkg.backends.torch")]
    assert rules.cycles(edges) == [["pkg.backends.torch", "pkg.settings"]]


def test_a_typing_import_upward_is_caught(tmp_path: Path) -> None:
    edges = _package(tmp_path, {
        "__init__.py": "", "plan/__init__.py": "", "language/__init__.py": "",
        "plan/plan.py": "",
        "language/model.py": "from typing import TYPE_CHECKING\n"
                             "if TYPE_CHECKING:\n    from pkg.plan.plan import Plan\n",
    })
    assert rules.upward(edges, LAYERS) == [("pkg.language.model", "pkg.plan.plan")]


def test_a_language_value_importing_the_model_is_caught(tmp_path: Path) -> None:
    edges = _package(tmp_path, {
        "__init__.py": "", "language/__init__.py": "", "language/values/__init__.py": "",
        "language/model.py": "",
        "language/values/steps.py": "def f():\n    from pkg.language.model import Policy\n",
    })
    assert rules.upward(edges, LANGUAGE, depth=2) == [
        ("pkg.language.values.steps", "pkg.language.model")]


def test_process_state_importing_a_role_is_caught(tmp_path: Path) -> None:
    edges = _package(tmp_path, {
        "__init__.py": "", "runtime/__init__.py": "", "runtime/process/__init__.py": "",
        "runtime/role/__init__.py": "", "runtime/role/profiler.py": "",
        "runtime/process/state.py": "from pkg.runtime.role.profiler import RoleProfiler\n",
    })
    assert rules.upward(edges, RUNTIME, depth=2) == [
        ("pkg.runtime.process.state", "pkg.runtime.role.profiler")]


@pytest.mark.parametrize("text", [
    "import os\nos.replace(a, b)\n",
    "import os\nos.link(a, b, src_dir_fd=d)\n",
    "import os\nos.rename(a, b)\n",
    "import shutil\nshutil.move(a, b)\n",
    "import os\nfd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL)\n",
    "from os import O_EXCL, O_CREAT\n",
    "from os import replace\n",
    "path.hardlink_to(other)\n",
])
def test_a_second_publisher_is_caught(text: str) -> None:
    assert rules.publishing(ast.parse(text))


def test_plain_file_work_is_no_publishing() -> None:
    text = "import os\nos.unlink(p)\nos.makedirs(d)\nopen(p, 'w').write(s.replace('a', 'b'))\n"
    assert rules.publishing(ast.parse(text)) == []


@pytest.mark.parametrize("text", [
    "events = json.load(f)['traceEvents']\n",
    "events = data.get('traceEvents', [])\n",
    "if 'traceEvents' in data:\n    pass\n",
    "start = text.find('\"traceEvents\": [')\n",
    "match = re.search(r'\"traceEvents\"\\s*:', text)\n",
])
def test_a_second_trace_reader_is_caught(text: str) -> None:
    assert rules.trace_parsing(ast.parse(text))


def test_writing_or_naming_trace_events_is_no_parsing() -> None:
    text = ("parts = ['{\"traceEvents\":[']\n"
            "raise TraceError(f'at event {n} of traceEvents')\n")
    assert rules.trace_parsing(ast.parse(text)) == []


@pytest.mark.parametrize("text", [
    "line = {'event': 'trace', 'capture': cid, 'status': 'failed'}\n",
    "line = dict(identity, event='open', capture=cid)\n",
    "record.update(event='note', note='slow')\n",
    "record['event'] = 'close'\n",
    "line = {'event': 'summary', 'capture': cid, 'status': 'cut'}\n",
])
def test_a_manifest_line_built_by_hand_is_caught(text: str) -> None:
    assert rules.record_building(ast.parse(text))


def test_reading_manifest_lines_is_no_building() -> None:
    text = ("if r['event'] == 'trace':\n    pass\n"
            "row.update(event='capture', capture=key)\n"
            "record.setdefault('event', 'trace')\n")
    assert rules.record_building(ast.parse(text)) == []


def test_a_private_name_from_another_package_is_caught() -> None:
    here = PACKAGE / "cli" / "report.py"
    text = ("from policy_engine.runtime.capture.driver import _Cell\n"
            "from policy_engine.cli._common import prog\n"
            "from policy_engine.analysis.window import _steps\n"
            "from policy_engine.runtime import _parts\n")
    assert rules.private_imports(ast.parse(text), "policy_engine.cli.report", here,
                                 MODULES) == [
        "line 1: _Cell from policy_engine.runtime.capture.driver",
        "line 3: _steps from policy_engine.analysis.window",
        "line 4: _parts from policy_engine.runtime",
    ]


def test_analysis_outside_the_reading_side_is_caught() -> None:
    text = ("from policy_engine.analysis.chrome_trace import TraceError, TraceReader\n"
            "from policy_engine.analysis import summary\n"
            "from policy_engine.analysis.window import compare\n"
            "for e in reader.events():\n    pass\n"
            "from policy_engine.analysis.listing import collect\n")
    assert rules.analysis_outside(ast.parse(text)) == [
        "line 1: imports the trace reader", "line 2: imports policy_engine.analysis",
        "line 3: imports policy_engine.analysis.window", "line 4: reads trace events"]


def test_a_test_importing_a_private_name_of_the_reading_side_is_caught() -> None:
    text = ("from policy_engine.analysis.listing import _cell, collect\n"
            "from policy_engine.analysis import _internal\n"
            "import policy_engine.analysis._hidden\n"
            "from policy_engine.runtime.capture.driver import _Cell\n")
    assert rules.private_names_of(ast.parse(text), "policy_engine.analysis") == [
        "line 1: _cell from policy_engine.analysis.listing",
        "line 2: _internal from policy_engine.analysis",
        "line 3: the private module policy_engine.analysis._hidden"]


def test_private_names_stay_free_inside_a_package() -> None:
    here = PACKAGE / "runtime" / "role" / "profiler.py"
    text = ("from policy_engine.runtime.role.wrapping import _Cell\n"
            "from policy_engine.runtime.role import _parts\n"
            "from . import _local\n"
            "from policy_engine.runtime import manifest as _write\n"
            "from policy_engine._resources import read_resource\n")
    assert rules.private_imports(ast.parse(text), "policy_engine.runtime.role.profiler", here,
                                 MODULES) == []


def test_a_mixin_is_caught() -> None:
    text = ("class Failures:\n    plan: object\n"
            "    def _turn_off(self, why: str) -> None: ...\n"
            "    def _close(self) -> None:\n        \"\"\"Filled in.\"\"\"\n        ...\n"
            "    def real(self) -> int:\n        return 1\n")
    assert rules.mixins(ast.parse(text)) == [
        "line 3: Failures._turn_off is a stub: Failures is a mixin",
        "line 4: Failures._close is a stub: Failures is a mixin"]


def test_protocols_and_abstract_hooks_are_no_mixins() -> None:
    text = ("from typing import Protocol\nimport abc\n"
            "class Running(Protocol):\n    def end(self) -> None: ...\n"
            "class Session(abc.ABC):\n    @abc.abstractmethod\n"
            "    def start(self) -> None: ...\n    def note(self) -> None:\n        pass\n")
    assert rules.mixins(ast.parse(text)) == []


def test_a_reexport_is_caught() -> None:
    text = ("from policy_engine.files.layout import MANIFEST_DIR as MANIFEST_DIR\n"
            "from policy_engine.runtime.process.budget import Budget\n"
            "import os as os\n"
            "def write_request() -> None: ...\n"
            "__all__ = ['Budget', 'write_request']\n")
    assert rules.reexports(ast.parse(text)) == [
        "line 1: MANIFEST_DIR as MANIFEST_DIR", "line 3: os as os",
        "line 5: __all__ hands on Budget, imported at line 2"]


def test_aliases_and_own_names_are_no_reexports() -> None:
    text = ("from policy_engine.runtime.triggers import step_triggers as triggers\n"
            "import numpy as np\nX = 1\n__all__ = ['X']\n")
    assert rules.reexports(ast.parse(text)) == []


@pytest.mark.parametrize("text", [
    "later = getattr(self.session, 'save_later', None)\n",
    "if hasattr(session, 'set_stem'):\n    session.set_stem(stem)\n",
    "threads = all(getattr(s, 'any_thread', False) for _, s in parts)\n",
    "call = getattr(part_session, method, None)\n",
])
def test_a_probed_session_hook_is_caught(text: str) -> None:
    assert rules.session_probing(ast.parse(text))


def test_calling_hooks_and_probing_other_objects_is_no_session_probing() -> None:
    text = ("session.set_stem(stem)\nif session.saves_later:\n    pass\n"
            "method = getattr(self.engine, what)\n"
            "hook = getattr(module, 'session_settings', None)\n")
    assert rules.session_probing(ast.parse(text)) == []


def test_an_oversized_module_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "long.py"
    path.write_text("x = 1\n" * (MAX_LINES + 1))
    with pytest.raises(AssertionError):
        test_modules_fit_in_one_sitting(path)


@pytest.mark.parametrize("text", [
    "ok = isinstance(v, int) and not isinstance(v, bool)\n",
    "if not isinstance(step, int) or isinstance(step, bool) or step < 0:\n    pass\n",
    "bad = isinstance(x.get('n'), bool) or not isinstance(x.get('n'), int)\n",
])
def test_an_int_check_written_out_is_caught(text: str) -> None:
    assert rules.int_checks(ast.parse(text))


def test_other_kind_checks_are_no_int_check() -> None:
    text = ("ok = isinstance(v, (int, float)) and not isinstance(v, bool)\n"
            "flag = isinstance(a, int) and not isinstance(b, bool)\n"
            "ok = is_int(v) and v >= 0\n")
    assert rules.int_checks(ast.parse(text)) == []


def test_a_private_name_nothing_uses_is_caught() -> None:
    trees = {"pkg.off": ast.parse("def _off_step() -> None:\n    pass\n"
                                  "def _used() -> int:\n    return 1\n"
                                  "_TABLE = {'a': _used}\n_NAMED = 1\n"),
             "pkg.other": ast.parse("from pkg.off import _NAMED\nx = 'a'\n")}
    assert rules.unused_private_names(trees, ["pkg.off"]) == {
        "pkg.off": ["line 1: _off_step", "line 5: _TABLE"]}


def test_an_alias_property_is_caught() -> None:
    text = ("class ProcessState:\n"
            "    @property\n    def usr2_count(self) -> int:\n"
            "        return self.hooks.usr2_count\n"
            "    @property\n    def name(self) -> str:\n        return self._name\n"
            "    @property\n    def total(self) -> int:\n"
            "        return self.a.n + self.b.n\n")
    assert rules.alias_properties(ast.parse(text)) == [
        "line 3: ProcessState.usr2_count is self.hooks.usr2_count"]


def test_reaching_into_the_process_state_is_caught() -> None:
    text = ("with STATE.lock:\n    if key in STATE.warned:\n        pass\n"
            "STATE.hooks.usr2_count\nwarn_once(key, 'said')\n")
    assert rules.state_fields(ast.parse(text), ["warned", "lock"]) == [
        "line 1: STATE.lock", "line 2: STATE.warned"]


@pytest.mark.parametrize("text", [
    "capture.end('partial')\n",
    "line = trace_line(record, capture=cid, status='failed')\n",
    "if status == 'complete':\n    pass\n",
    "ok = status not in ('complete', 'partial')\n",
    "def end(self, status: str = 'complete') -> None:\n    pass\n",
])
def test_a_status_spelled_as_a_string_is_caught(text: str) -> None:
    assert rules.status_strings(ast.parse(text))


def test_status_words_in_messages_and_keys_are_no_status() -> None:
    text = ("log.warning('the summary %s', 'was cut' if cut else 'failed')\n"
            "rows = data['interrupted']\ncapture.end(Status.PARTIAL)\n"
            "'A capture ends complete or partial.'\n")
    assert rules.status_strings(ast.parse(text)) == []


@pytest.mark.parametrize("text", [
    "manifest.append(out, open_line(record, capture=cid, start=now))\n",
    "line = records.trace_line(part.record, capture=part.id, status=Status.FAILED)\n",
    "manifest.append(out, close_line(capture=cid, status=Status.FAILED, traces=1))\n",
    "line = CloseLine.build({}, capture=cid, status='failed').to_json()\n",
])
def test_a_capture_line_written_outside_the_lifecycle_is_caught(text: str) -> None:
    assert rules.lifecycle_lines(ast.parse(text))


def test_the_lifecycle_and_other_lines_are_no_second_lifecycle() -> None:
    text = ("lines = Lines(record, out)\nlines.open()\nlines.fail(error, steps=[1])\n"
            "manifest.append(out, note_line(base, note='slow_step'))\n"
            "line = summary_line(base, capture=cid, path=p, status=s)\n")
    assert rules.lifecycle_lines(ast.parse(text)) == []


def test_an_untyped_answer_in_the_public_api_is_caught() -> None:
    text = ("def analyze(path: str) -> dict[str, Any]: ...\n"
            "def scan(found: dict[str, Any]) -> Scan: ...\n"
            "def _helper(x: dict[str, Any]) -> None: ...\n"
            "class RunAnalysis:\n    notes: list[dict[str, Any]]\n    root: str\n"
            "    def to_json(self) -> dict[str, Any]: ...\n"
            "    def head(self) -> dict[str, Any]: ...\n")
    assert rules.untyped_answers(ast.parse(text), ["analyze", "scan", "RunAnalysis"]) == [
        "line 1: analyze returns it", "line 2: scan(found)", "line 5: RunAnalysis.notes",
        "line 8: RunAnalysis.head returns it"]


def test_public_names_are_found_where_they_are_defined() -> None:
    text = ("__all__ = ['Error', 'analyze', 'RunAnalysis']\n"
            "_LATER = {'RunAnalysis': 'answers'}\n")
    assert rules.public_homes(ast.parse(text), "pkg") == {
        "pkg": ["Error", "analyze"], "pkg.answers": ["RunAnalysis"]}

