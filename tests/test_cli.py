"""The command line as a whole: exit codes, init, schema, and that it never imports torch."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from policy_engine.cli import main as cli_main
from policy_engine.cli import validate as validate_cmd
from policy_engine.cli.main import main
from policy_engine.language.schema.build import SCHEMA_NAME

ROOT = Path(__file__).resolve().parent.parent
POLICIES = sorted((ROOT / "policies").glob("*.yaml"))


def run_cli(*argv: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "policy_engine", *argv], cwd=cwd,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def test_the_cli_never_imports_torch(tmp_path: Path) -> None:
    """validate, explain, schema, init and every --help run without importing torch."""
    script = f"""
import contextlib, io, sys
from policy_engine.cli.main import COMMANDS, main
calls = [
    ["validate", "--strict", "--world", "8", "policies/megatron_3d.yaml",
     "policies/verl_ppo.yaml", "policies/ascend_npu.yaml"],
    ["validate", "--format", "json", "tests/data/invalid/several.yaml"],
    ["explain", "policies/megatron_3d.yaml", "--role", "trainer", "--format", "json"],
    ["explain", "policies/verl_ppo.yaml", "--role", "actor", "--world", "4"],
    ["schema"],
    ["init", {str(tmp_path / "starter.yaml")!r}],
    *[[name, "--help"] for name in COMMANDS],
]
codes = []
for argv in calls:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            codes.append(main(argv))
        except SystemExit as exit_:
            codes.append(exit_.code)
print(codes[:6])
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    codes, torch_modules = done.stdout.splitlines()
    assert codes == "[0, 1, 0, 0, 0, 0]"
    assert torch_modules == "[]"


def test_validation_imports_no_jsonschema() -> None:
    """validate and load_policy check with the engine's own validator: jsonschema (and its
    format plugins, slow to import where installed) is a test dependency only."""
    script = """
import contextlib, io, sys
from policy_engine import load_policy
from policy_engine.cli.main import main
load_policy("policies/verl_ppo.yaml")
with contextlib.redirect_stdout(io.StringIO()):
    codes = [main(["validate", "--world", "8", "policies/megatron_3d.yaml"]),
             main(["validate", "tests/data/invalid/several.yaml"])]
print(codes, sorted(m for m in sys.modules if m.split(".")[0] == "jsonschema"))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[0, 1] []"


def test_validate_leaves_the_readers_and_the_version_unread() -> None:
    """Every command imports AnalysisError; validate reads no trace or manifest and prints
    no version, so neither the reading side's modules nor the distribution's metadata are
    imported (they were a third of validate's start-up)."""
    script = """
import contextlib, io, sys
from policy_engine.cli.main import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(["validate", "policies/verl_ppo.yaml"])
readers = ("policy_engine.analysis.run", "policy_engine.analysis.compare",
           "policy_engine.analysis.manifests", "importlib.metadata")
print(code, sorted(m for m in readers if m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0 []"


def test_importtime_shows_no_torch() -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "policy_engine", "validate",
         "policies/verl_ppo.yaml"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")]
    assert "policy_engine.language.rules.checks" in imported  # the run got as far as checking
    assert not [name for name in imported if name.split(".")[0] == "torch"]


# ---------------------------------------------------------------- exit codes


def test_exit_codes_of_the_entry_point(tmp_path: Path) -> None:
    invalid = run_cli("validate", "policies/verl_ppo.yaml", "tests/data/invalid/backend.yaml")
    assert invalid.returncode == 1
    assert run_cli("validate", str(tmp_path / "missing.yaml")).returncode == 2


@pytest.mark.parametrize(("argv", "code"), [
    (["validate", "policies/verl_ppo.yaml"], 0),
    (["validate", "tests/data/invalid/backend.yaml"], 1),
    (["validate", "missing.yaml"], 2),
    (["validate", "--world", "zero", "policies/verl_ppo.yaml"], 2),
    (["frobnicate"], 2),
    ([], 2),
    (["--help"], 0),
])
def test_exit_codes(argv: list[str], code: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert main(argv) == code


def test_internal_error_exits_3(capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(path: str, args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(validate_cmd, "analyze_file", broken)
    assert main(["validate", str(ROOT / "policies" / "verl_ppo.yaml")]) == cli_main.EXIT_INTERNAL
    err = capsys.readouterr().err
    assert "policy-engine: internal error: RuntimeError('boom')" in err


def test_interrupt_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(path: str, args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(validate_cmd, "analyze_file", interrupted)
    assert main(["validate", str(ROOT / "policies" / "verl_ppo.yaml")]) == 130


def test_unreadable_file_exits_2_without_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "policy.yaml"
    folder.mkdir()
    assert main(["validate", str(folder)]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert out.splitlines()[-1] == f"{folder}: unreadable (1 error)"


def test_errors_go_to_stdout_with_the_summary(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["validate", "tests/data/invalid/unknown_key.yaml"]) == 1
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == [
        "tests/data/invalid/unknown_key.yaml:7:5: error: unknown key 'rnaks' "
        "(did you mean 'ranks'?) (at $.roles.actor.rnaks)",
        "tests/data/invalid/unknown_key.yaml: invalid (1 error)",
    ]


# ---------------------------------------------------------------- schema


def test_schema_prints_the_schema_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    out = capsys.readouterr().out
    assert out == (ROOT / "schemas" / SCHEMA_NAME).read_text(encoding="utf-8")
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(json.loads(out))


# ---------------------------------------------------------------- init


def test_init_writes_a_starter_that_validates(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "profile_policy.yaml"
    assert main(["init", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"wrote {path}", f"wrote {tmp_path / 'profile_policy.schema.json'} (the JSON Schema "
        "editors read: the policy's first line points at it)"]
    text = path.read_text()
    assert text.startswith("# yaml-language-server: $schema=")
    assert "policy-engine validate profile_policy.yaml" in text
    assert main(["validate", "--strict", "--world", "4", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: valid\n"
    assert main(["explain", str(path), "--role", "actor", "--world", "4"]) == 0


def test_init_defaults_to_profile_policy_yaml(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["init"]) == 0
    assert (tmp_path / "profile_policy.yaml").is_file()
    sub = tmp_path / "exp"
    sub.mkdir()
    assert main(["init", str(sub)]) == 0  # a folder gets profile_policy.yaml inside
    assert (sub / "profile_policy.yaml").is_file()


def test_init_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("mine\n")
    assert main(["init", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"policy-engine init: error: {path} exists; use --force to overwrite it\n")
    assert path.read_text() == "mine\n"
    assert main(["init", "--force", str(path)]) == 0
    assert path.read_text().startswith("# yaml-language-server")


def test_init_into_a_missing_folder_is_a_usage_error(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nope" / "p.yaml"
    assert main(["init", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"policy-engine init: error: cannot write {path}: No such file or directory\n")


@pytest.mark.parametrize("name", ["starter.toml", "starter.json"])
def test_init_writes_yaml_only(name: str, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / name
    assert main(["init", str(path)]) == 2
    assert "init writes YAML" in capsys.readouterr().err
    assert not path.exists()


# ---------------------------------------------------------------- --check-runtime


def test_check_runtime_passes_where_the_backend_can_run(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["validate", "--check-runtime", "--world", "8", "policies/verl_ppo.yaml"]) == 0
    assert capsys.readouterr().out == "policies/verl_ppo.yaml: valid\n"


def test_check_runtime_reports_a_missing_package(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.chdir(ROOT)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch_npu" else real(name, *a))
    assert main(["validate", "--check-runtime", "policies/ascend_npu.yaml"]) == 1
    lines = capsys.readouterr().out.splitlines()
    source = (ROOT / "policies" / "ascend_npu.yaml").read_text().splitlines()
    line = source.index("  backend: mstx") + 1
    assert lines[0].startswith(f"policies/ascend_npu.yaml:{line}:12: error: backend mstx: "
                               "torch_npu is not installed")
    assert lines[0].endswith("(at $.defaults.backend)")
    assert lines[-1] == "policies/ascend_npu.yaml: invalid (1 error)"


# ---------------------------------------------------------------- hostile files


def test_a_named_pipe_exits_2_without_waiting(tmp_path: Path) -> None:
    pipe = tmp_path / "policy.yaml"
    os.mkfifo(pipe)
    done = run_cli("validate", str(pipe))  # a read that blocks times out
    assert done.returncode == 2
    assert done.stdout.splitlines() == [
        f"{pipe}: error: not a regular file: {pipe} (a named pipe) (at $)",
        f"{pipe}: unreadable (1 error)",
    ]


@pytest.mark.parametrize(("name", "text", "where", "message"), [
    ("deep.yaml", "[" * 60_000, "1:65", "nesting is deeper than 64 levels"),
    ("deep.json", "[" * 60_000, "1:65", "nesting is deeper than 64 levels"),
    ("deep.toml", "a = " + "[" * 60_000, "1:68", "nesting is deeper than 64 levels"),
    ("big.yaml", "version: " + "9" * 5000, "1:10",
     "integer too large: 5000 digits (a policy's numbers are below 2**63)"),
    ("big.json", '{"version": ' + "9" * 5000 + "}", "1:13",
     "integer too large: 5000 digits (a policy's numbers are below 2**63)"),
    ("big.toml", "version = " + "9" * 5000, "1:11",
     "integer too large: 5000 digits (a policy's numbers are below 2**63)"),
])
def test_hostile_files_are_invalid_with_a_position(
        name: str, text: str, where: str, message: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert main(["validate", str(path)]) == 1
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0].startswith(f"{path}:{where}: error: {message} (at $")
    assert lines[1:] == [f"{path}: invalid (1 error)"]


def test_a_deep_override_from_the_environment_is_invalid(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PROFILE_POLICY_SET", "prefix=" + "[" * 60_000)
    assert main(["validate", "policies/verl_ppo.yaml"]) == 1
    out = capsys.readouterr().out
    assert "Traceback" not in out
    assert out.splitlines()[0].endswith(
        "...: error: nesting is deeper than 64 levels (at $.prefix)")


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    import policy_engine

    try:  # the installed distribution's; the package's own when run from the source tree
        expected = metadata.version("policy-engine")
    except metadata.PackageNotFoundError:
        expected = policy_engine.__version__
    assert cli_main.main(["--version"]) == 0
    assert capsys.readouterr().out == f"policy-engine {expected}\n"


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each command's own parser, as ``main`` builds it when that command runs."""
    parsers = {}
    for name, (module, text) in cli_main.COMMANDS.items():
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"policy_engine.cli.{module}").add_parser(sub, name, text)
        parsers[name] = sub.choices[name]
    return parsers


def test_every_option_of_every_command_says_what_it_is() -> None:
    for name, parser in command_parsers().items():
        silent = [a.option_strings or [a.dest] for a in parser._actions if not a.help]
        assert silent == [], name


def synopses(page: Path) -> dict[str, str]:
    """The commands' synopses in ``page``: in a plain code block, a line
    ``policy-engine COMMAND ...`` with its indented continuation lines, kept where it shows
    an option in brackets (or is the whole README list, which names bare ``schema``)."""
    found: dict[str, str] = {}
    fence: str | None = None  # the opening fence's language, while inside a block
    name = None
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None
            name = None
            continue
        head = re.match(r"policy-engine ([a-z-]+)", line)
        if fence == "" and head:
            name = head.group(1)
            found[name] = line
        elif fence == "" and name is not None and line.startswith(" "):
            found[name] += " " + line.strip()
        else:
            name = None
    return {name: line for name, line in found.items() if "[" in line or name == "schema"}


def test_readme_synopsis_lists_every_command_in_help_order() -> None:
    assert list(synopses(ROOT / "README.md")) == list(cli_main.COMMANDS)


@pytest.mark.parametrize("page", ["README.md", *sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))])
def test_every_synopsis_shows_every_option(page: str) -> None:
    parsers = command_parsers()
    for name, line in synopses(ROOT / page).items():
        missing = [a.option_strings for a in parsers[name]._actions
                   if a.option_strings and "--help" not in a.option_strings
                   and not any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", line)
                               for o in a.option_strings)]
        assert missing == [], f"{page}: policy-engine {name}"


def test_every_install_command_works_from_a_checkout() -> None:
    """policy-engine is not published on an index: the pages, the example policies and the
    docstrings install it from a checkout (``pip install -e '.[verl]'``), never by name."""
    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "policies").iterdir(),
             *(ROOT / "policy_engine").rglob("*.py")]
    by_name = re.compile(r"pip install[^\n`&;|#]*?[\s'\"]policy-engine\b")
    found = [f"{page.relative_to(ROOT)}: {hit}" for page in pages if page.is_file()
             for hit in by_name.findall(page.read_text(encoding="utf-8"))]
    assert found == []


def test_help_lists_the_commands_in_the_order_of_the_work(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    listed = re.findall(r"^    ([a-z-]+)", capsys.readouterr().out, re.M)
    assert listed == list(cli_main.COMMANDS)
    assert listed[:5] == ["init", "from-verl", "schema", "validate", "explain"]
    assert listed.index("analyze") < listed.index("compare") < listed.index("report")
