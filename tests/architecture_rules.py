"""The rules tests/test_architecture.py holds the source to, as functions of a module's text
(or of a package folder), so that each rule can be shown to catch a planted violation.

Every rule reads the code with ``ast``, never by importing it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

#: The kinds of manifest line (policy_engine.files.records.EVENTS, spelled here so that
#: the rule does not import the code it checks).
MANIFEST_EVENTS = frozenset({"open", "trace", "close", "note", "summary"})
#: Calls that publish a file by name: only the one publisher may make them.
PUBLISHING_CALLS = frozenset({"link", "rename", "replace", "renames", "move"})


def module_name(path: Path, root: Path) -> str:
    """``policy_engine.runtime.role.off`` for ``root/policy_engine/runtime/role/off.py``."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_under(root: Path, package: str) -> dict[str, Path]:
    return {module_name(p, root): p for p in (root / package).rglob("*.py")}


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imports(tree: ast.AST, name: str, path: Path, modules: Iterable[str]) -> set[str]:
    """Modules of ``modules`` that module ``name`` imports, wherever in the file: inside
    functions, under ``if TYPE_CHECKING:`` (a typing import stands for a real dependency),
    and named by a string that is a module's full name (what importlib is handed)."""
    known = set(modules)
    package = _package_of(name, path)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in known else base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and "." in node.value and node.value in known:
            found.add(node.value)  # a dotted name: "policy_engine" alone is also a word
    return {m for m in found if m in known and m != name}


def graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    return {name: imports(ast.parse(path.read_text()), name, path, modules)
            for name, path in modules.items()}


def cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The import cycles (strongly connected components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in edges[node]:
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in edges:
        if node not in index:
            visit(node)
    return sorted(found)


def layer(name: str, depth: int = 1) -> str:
    """The package (or module) ``depth`` names deep: ``policy_engine.<layer>...`` at 1,
    ``policy_engine.language.<layer>...`` at 2."""
    parts = name.split(".")
    return parts[depth] if len(parts) > depth else "__init__"


def upward(edges: Mapping[str, Iterable[str]], layers: list[str],
           depth: int = 1) -> list[tuple[str, str]]:
    """Imports from a layer to one above it (to its right in ``layers``)."""
    out = []
    for name, deps in edges.items():
        if layer(name, depth) not in layers:
            continue
        here = layers.index(layer(name, depth))
        out += [(name, dep) for dep in sorted(deps)
                if layer(dep, depth) in layers and layers.index(layer(dep, depth)) > here]
    return sorted(out)


def _lines(found: Iterable[tuple[int, str]]) -> list[str]:
    return [f"line {line}: {what}" for line, what in sorted(found)]


def publishing(tree: ast.AST) -> list[str]:
    """Calls that give a file its name, or make one exclusively, outside the publisher:
    ``os.link``/``os.rename``/``os.replace``/``shutil.move`` (called, or imported by
    name), ``Path.rename``/``Path.replace``/``Path.hardlink_to`` and ``O_EXCL``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if node.attr == "O_EXCL":
                found.append((node.lineno, "O_EXCL"))
            elif owner in ("os", "shutil") and node.attr in PUBLISHING_CALLS:
                found.append((node.lineno, f"{owner}.{node.attr}"))
            elif node.attr == "hardlink_to":
                found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Name) and node.id == "O_EXCL":
            found.append((node.lineno, "O_EXCL"))
        elif isinstance(node, ast.ImportFrom) and node.module in ("os", "shutil"):
            found += [(node.lineno, f"from {node.module} import {a.name}")
                      for a in node.names if a.name in PUBLISHING_CALLS | {"O_EXCL"}]
    return _lines(found)


def _says_trace_events(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) \
        and "traceEvents" in node.value


def trace_parsing(tree: ast.AST) -> list[str]:
    """Reading a Chrome trace's ``traceEvents`` outside the one reader: the key used as a
    subscript, asked of a mapping (``get``, ``pop``, ``in``), or looked for in text
    (``find``, ``index``, ``split``, a regular expression)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _says_trace_events(node.slice):
            found.append((node.lineno, "['traceEvents']"))
        elif isinstance(node, ast.Compare) and _says_trace_events(node.left) \
                and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            found.append((node.lineno, "'traceEvents' in ..."))
        elif isinstance(node, ast.Call) and any(map(_says_trace_events, node.args)):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else \
                func.id if isinstance(func, ast.Name) else "?"
            found.append((node.lineno, f"{called}('...traceEvents...')"))
    return _lines(found)


def _event_value(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value in MANIFEST_EVENTS


def record_building(tree: ast.AST) -> list[str]:
    """Manifest lines built outside the one builder module: a dict display with the key
    ``"event"`` set to a manifest kind (open, trace, close, note, summary), a call given
    ``event=<kind>`` (``dict(...)``, ``.update(...)``), or ``x["event"] = <kind>``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            found += [(node.lineno, f"{{'event': {v.value!r}}}")  # type: ignore[attr-defined]
                      for k, v in zip(node.keys, node.values, strict=True)
                      if isinstance(k, ast.Constant) and k.value == "event"
                      and _event_value(v)]
        elif isinstance(node, ast.Call):
            found += [(node.lineno, f"event={kw.value.value!r}")  # type: ignore[attr-defined]
                      for kw in node.keywords if kw.arg == "event" and _event_value(kw.value)]
        elif isinstance(node, ast.Assign) and _event_value(node.value):
            found += [(node.lineno, f"['event'] = {node.value.value!r}")  # type: ignore
                      for target in node.targets if isinstance(target, ast.Subscript)
                      and isinstance(target.slice, ast.Constant)
                      and target.slice.value == "event"]
    return _lines(found)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _inside(package: str, folder: str) -> bool:
    return package == folder or package.startswith(folder + ".")


def private_imports(tree: ast.AST, name: str, path: Path,
                    modules: Mapping[str, Path]) -> list[str]:
    """Private names (``_x``) imported from a module of another folder, and private modules
    imported from outside their folder: a private name is its folder's own, sub-folders
    included (``cli/analysis/`` may use ``cli/_common.py``, ``cli/report.py`` no private
    name of ``cli/analysis/`` or ``runtime/``)."""
    here = _package_of(name, path)
    found: list[tuple[int, str]] = []

    def folder(module: str) -> str:
        known = modules.get(module)
        return module if known is not None and known.name == "__init__.py" \
            else module.rpartition(".")[0]

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level \
                and (node.module or "").startswith("policy_engine"):
            source = node.module or ""
            if _inside(here, folder(source)):
                continue
            found += [(node.lineno, f"{a.name} from {source}") for a in node.names
                      if _private(a.name)]
            if _private(source.rpartition(".")[2]):
                found.append((node.lineno, f"the private module {source}"))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, f"the private module {a.name}") for a in node.names
                      if a.name.startswith("policy_engine") and not _inside(here, folder(a.name))
                      and _private(a.name.rpartition(".")[2])]
    return _lines(found)


def _stub(node: ast.stmt) -> bool:
    """A method whose body is ``...`` (after any docstring) and that nothing marks as a
    declaration (``abstractmethod``, ``overload``)."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    marks = {ast.unparse(d).rpartition(".")[2] for d in node.decorator_list}
    if marks & {"abstractmethod", "overload"}:
        return False
    body = node.body[1:] if node.body and isinstance(node.body[0], ast.Expr) \
        and isinstance(node.body[0].value, ast.Constant) \
        and isinstance(node.body[0].value.value, str) else node.body
    return len(body) == 1 and isinstance(body[0], ast.Expr) \
        and isinstance(body[0].value, ast.Constant) and body[0].value.value is Ellipsis


def mixins(tree: ast.AST) -> list[str]:
    """Classes that are parts of another class's state: a class (not a Protocol) that
    declares a method as a stub (``def f(self): ...``), to be filled in by the class that
    mixes it in."""
    found = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        if any(ast.unparse(b).rpartition(".")[2] == "Protocol" for b in cls.bases):
            continue
        found += [(item.lineno, f"{cls.name}.{item.name} is a stub: {cls.name} is a mixin")
                  for item in cls.body if _stub(item)]
    return _lines(found)


def reexports(tree: ast.AST) -> list[str]:
    """Names a module hands on from elsewhere: ``import x as x`` / ``from m import x as
    x`` (the explicit re-export idiom) and ``__all__`` entries it imports rather than
    defines."""
    imported: dict[str, int] = {}
    found: list[tuple[int, str]] = []
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound = alias.asname or alias.name.partition(".")[0]
                imported[bound] = node.lineno
                if alias.asname is not None and alias.asname == alias.name.rpartition(".")[2]:
                    found.append((node.lineno, f"{alias.name} as {alias.asname}"))
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            found += [(node.lineno, f"__all__ hands on {e.value}, imported at line "
                       f"{imported[e.value]}") for e in ast.walk(node.value)
                      if isinstance(e, ast.Constant) and e.value in imported]
    return _lines(found)


#: What only the reading side may use: the trace reader itself and the modules that
#: compute figures from traces and manifests.
ANALYSIS_INTERNALS = ("policy_engine.analysis.intervals", "policy_engine.analysis.summary",
                      "policy_engine.analysis.window", "policy_engine.analysis.windows",
                      "policy_engine.analysis.trace_process",
                      "policy_engine.analysis.device_view", "policy_engine.analysis.ascend",
                      "policy_engine.analysis.npu_summary")


def analysis_outside(tree: ast.AST) -> list[str]:
    """Analysis done outside the reading package: an import of the trace reader's
    ``TraceReader`` or of a module that computes figures, or a loop over trace events
    (``.events()``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level:
            source = node.module or ""
            names = [a.name for a in node.names]
            if source in ANALYSIS_INTERNALS or any(
                    f"{source}.{n}" in ANALYSIS_INTERNALS for n in names):
                found.append((node.lineno, f"imports {source}"))
            elif source == "policy_engine.analysis.chrome_trace" and "TraceReader" in names:
                found.append((node.lineno, "imports the trace reader"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "events" and not node.args:
            found.append((node.lineno, "reads trace events"))
    return _lines(found)


def private_names_of(tree: ast.AST, package: str) -> list[str]:
    """Private names (``_x``) or private modules of ``package`` that ``tree`` imports."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level \
                and _inside(node.module or "", package):
            source = node.module or ""
            found += [(node.lineno, f"{a.name} from {source}") for a in node.names
                      if _private(a.name)]
            if any(_private(part) for part in source.split(".")):
                found.append((node.lineno, f"the private module {source}"))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, f"the private module {a.name}") for a in node.names
                      if _inside(a.name, package)
                      and any(_private(part) for part in a.name.split("."))]
    return _lines(found)


#: Every hook of policy_engine.backends.base.Session (spelled here so that the rule does
#: not import the code it checks; tests/test_backend_contract.py holds the two equal).
SESSION_HOOKS = frozenset({
    "prepare", "start", "step", "save", "discard", "range", "close",
    "any_thread", "saves_later", "set_reporter", "set_stem", "note", "save_later"})
_PROBES = frozenset({"getattr", "hasattr"})


def _names_a_session(node: ast.AST) -> bool:
    """``session``, ``self.session``, ``part_session``...: an object named a session."""
    name = node.id if isinstance(node, ast.Name) else \
        node.attr if isinstance(node, ast.Attribute) else ""
    return "session" in name.lower()


def session_probing(tree: ast.AST) -> list[str]:
    """A session's hooks looked up instead of called: ``getattr``/``hasattr`` on an object
    named a session, or asked for a hook of :class:`Session` by name (``getattr(s,
    "set_stem", None)``). Every session subclasses Session, whose optional hooks do
    nothing, so the runtime calls them directly."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in _PROBES and len(node.args) >= 2):
            continue
        owner, attr = node.args[0], node.args[1]
        hook = isinstance(attr, ast.Constant) and attr.value in SESSION_HOOKS
        if hook or _names_a_session(owner):
            what = repr(attr.value) if isinstance(attr, ast.Constant) else "a name"
            found.append((node.lineno, f"{node.func.id}(..., {what})"))
    return _lines(found)


def _isinstance_of(node: ast.AST, kind: str) -> str | None:
    """The first argument of ``isinstance(x, <kind>)`` (as source), else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        node = node.operand
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id == "isinstance" and len(node.args) == 2 \
            and isinstance(node.args[1], ast.Name) and node.args[1].id == kind:
        return ast.unparse(node.args[0])
    return None


def int_checks(tree: ast.AST) -> list[str]:
    """"An int, not a bool" written out (``isinstance(x, int) and not isinstance(x,
    bool)``, or its negation): :func:`policy_engine.errors.is_int` says it once."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.BoolOp):
            continue
        ints = {_isinstance_of(v, "int") for v in node.values} - {None}
        bools = {_isinstance_of(v, "bool") for v in node.values} - {None}
        found += [(node.lineno, f"{name}: an int and not a bool, written out")
                  for name in sorted(ints & bools)]  # type: ignore[type-var]
    return _lines(found)


def _defined_privately(tree: ast.AST) -> dict[str, int]:
    """The private names (``_x``) a module defines at its top level: functions, classes
    and assignments."""
    found: dict[str, int] = {}
    for node in getattr(tree, "body", []):
        names: list[str] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
        found.update({n: node.lineno for n in names if _private(n)})
    return found


def _named(tree: ast.AST) -> set[str]:
    """Every name a module reads, imports, or spells as an attribute or a string."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.alias):
            out.add(node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.add(node.value)
    return out


def unused_private_names(trees: Mapping[str, ast.AST],
                         among: Iterable[str]) -> dict[str, list[str]]:
    """Private top-level names of the modules ``among`` that no module of ``trees`` uses:
    code left behind (a private name is its folder's, so the package is where a use
    would be)."""
    used: set[str] = set().union(*(_named(tree) for tree in trees.values()))
    out: dict[str, list[str]] = {}
    for name in among:
        left = [f"line {line}: {n}" for n, line in sorted(
            _defined_privately(trees[name]).items(), key=lambda kv: kv[1]) if n not in used]
        if left:
            out[name] = left
    return out


def alias_properties(tree: ast.AST) -> list[str]:
    """Properties that hand on another object's field (``return self.hooks.usr2_count``):
    one value then has two names, and callers read it both ways."""
    found: list[tuple[int, str]] = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for item in cls.body:
            if not isinstance(item, ast.FunctionDef) or not any(
                    ast.unparse(d) == "property" for d in item.decorator_list):
                continue
            body = [b for b in item.body if not (isinstance(b, ast.Expr)
                                                 and isinstance(b.value, ast.Constant))]
            value = body[0].value if len(body) == 1 and isinstance(body[0], ast.Return) \
                else None
            if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Attribute) \
                    and isinstance(value.value.value, ast.Name) \
                    and value.value.value.id == "self":
                found.append((item.lineno, f"{cls.name}.{item.name} is {ast.unparse(value)}"))
    return _lines(found)


def state_fields(tree: ast.AST, fields: Iterable[str]) -> list[str]:
    """Uses of the process state's ``fields`` (``STATE.warned``, ``STATE.lock``)."""
    wanted = set(fields)
    return _lines((node.lineno, f"STATE.{node.attr}") for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and node.attr in wanted
                  and isinstance(node.value, ast.Name) and node.value.id == "STATE")


#: The words of a capture's status (policy_engine.files.records.Status, spelled here so
#: that the rule does not import the code it checks).
STATUS_WORDS = frozenset({"complete", "partial", "failed", "interrupted"})


def _status_word(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value in STATUS_WORDS


def status_strings(tree: ast.AST) -> list[str]:
    """A capture's status handed on or compared as a string (``capture.end("partial")``,
    ``status="failed"``, ``x == "complete"``, ``in ("complete", "partial")``, a default):
    ``files.records.Status`` names them, and its members are the words the manifest
    writes. The words inside messages are prose."""
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                found += [side] if _status_word(side) else [
                    e for e in getattr(side, "elts", []) if _status_word(e)]
        elif isinstance(node, ast.Call):
            found += [a for a in node.args if _status_word(a)]
            found += [k.value for k in node.keywords if _status_word(k.value)]
        elif isinstance(node, ast.arguments):
            found += [d for d in (*node.defaults, *node.kw_defaults) if _status_word(d)]
    return _lines((n.lineno, repr(n.value)) for n in found)  # type: ignore[attr-defined]


#: The builders of a capture's own lines (policy_engine.files.records), and their classes.
LIFECYCLE_BUILDERS = frozenset({"open_line", "trace_line", "close_line"})
LIFECYCLE_KINDS = frozenset({"OpenLine", "TraceLine", "CloseLine"})


def lifecycle_lines(tree: ast.AST) -> list[str]:
    """A capture's ``open``, ``trace`` or ``close`` line built outside its one lifecycle
    (``runtime/capture/lines.py`` ``Lines``): a call of ``open_line``, ``trace_line`` or
    ``close_line``, or of their classes' ``build``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else \
            func.attr if isinstance(func, ast.Attribute) else ""
        if name in LIFECYCLE_BUILDERS:
            found.append((node.lineno, f"{name}(...)"))
        elif name == "build" and isinstance(func, ast.Attribute) \
                and ast.unparse(func.value).rpartition(".")[2] in LIFECYCLE_KINDS:
            found.append((node.lineno, f"{ast.unparse(func)}(...)"))
    return _lines(found)


#: An answer handed on untyped: a JSON object whose keys no declaration names.
UNTYPED = "dict[str, Any]"


def untyped_answers(tree: ast.AST, names: Iterable[str]) -> list[str]:
    """Where the public definitions ``names`` of a module hand on or take an untyped
    answer (``dict[str, Any]``): a function's parameters or return, a class's fields, or
    the signatures of its public methods; ``to_json``, a record's JSON form, aside."""
    wanted = set(names)
    found: list[tuple[int, str]] = []

    def signature(fn: ast.FunctionDef | ast.AsyncFunctionDef, owner: str) -> None:
        args = fn.args
        for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
            if arg is not None and arg.annotation is not None \
                    and UNTYPED in ast.unparse(arg.annotation):
                found.append((fn.lineno, f"{owner}{fn.name}({arg.arg})"))
        if fn.returns is not None and UNTYPED in ast.unparse(fn.returns):
            found.append((fn.lineno, f"{owner}{fn.name} returns it"))

    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in wanted:
            signature(node, "")
        elif isinstance(node, ast.ClassDef) and node.name in wanted:
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and UNTYPED in ast.unparse(item.annotation):
                    found.append((item.lineno, f"{node.name}.{ast.unparse(item.target)}"))
                elif isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                        and item.name != "to_json" and not _private(item.name):
                    signature(item, f"{node.name}.")
    return _lines(found)


def public_homes(init: ast.AST, package: str) -> dict[str, list[str]]:
    """The public names of a package (its ``__init__``'s ``__all__``) by the module that
    defines them: the ``__init__`` itself, or the module its ``_LATER`` table names."""
    listed: list[str] = []
    later: dict[str, str] = {}
    for node in getattr(init, "body", []):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id == "__all__":
                listed = ast.literal_eval(node.value)
            elif node.targets[0].id == "_LATER":
                later = ast.literal_eval(node.value)
    homes: dict[str, list[str]] = {}
    for name in listed:
        module = f"{package}.{later[name]}" if name in later else package
        homes.setdefault(module, []).append(name)
    return homes
