"""Options and helpers shared by subcommands."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from policy_engine.cli.usage import UsageError
from policy_engine.errors import PolicyError
from policy_engine.files.publish import publish
from policy_engine.language.load import Analysis, analyze, read_source
from policy_engine.language.model import Policy
from policy_engine.language.read.document import PolicyFileError
from policy_engine.language.values.mesh import mesh_size, parse_mesh


def mesh_arg(text: str) -> dict[str, int]:
    try:
        return parse_mesh(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def whole_number(text: str) -> int:
    """An argument that is a count, 0 allowed."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(text)


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def policy_parser(sub: Any, name: str, help: str, doc: str | None, *, files: bool = False,
                  role: Mapping[str, Any] | None = None) -> argparse.ArgumentParser:
    """The parser of a command over a policy: ``FILE`` (``FILE...`` with ``files``), then
    ``--role`` with ``role``'s keywords when given, then the layout options."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help, description=doc)
    if files:
        parser.add_argument("files", nargs="+", metavar="FILE",
                            help="policy files (YAML, TOML or JSON)")
    else:
        parser.add_argument("file", metavar="FILE", help="the policy file (YAML, TOML or JSON)")
    if role:
        parser.add_argument("--role", **{"help": "the role, as the policy names it", **role})
    _add_layout_options(parser)
    return parser


def _add_layout_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world", type=positive_int, metavar="N",
                        help="number of ranks in the job (checks rank selectors)")
    parser.add_argument("--mesh", type=mesh_arg, metavar="pp=2,dp=2,tp=2",
                        help="parallel mesh, outermost first (replaces the policy's mesh)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="override a policy value (dotted key, YAML value); repeatable")


def add_format_option(parser: argparse.ArgumentParser, *choices: str) -> None:
    choices = choices or ("text", "json")
    parser.add_argument("--format", choices=choices, default=choices[0],
                        help=f"how to print the result: {', '.join(choices)} "
                             f"(default: {choices[0]})")


def _set_texts(sets: Sequence[str | Sequence[str]]) -> list[str]:
    """The ``--set`` values as text (argparse gives ``--set=--`` as a list)."""
    return [text if isinstance(text, str) else " ".join(map(str, text)) for text in sets]


def analyze_file(path: str, args: argparse.Namespace) -> Analysis:
    """Read and check one policy file as ``load_policy`` does (``--set``, then
    ``PROFILE_POLICY_SET``), against ``--world`` and ``--mesh``. Unreadable files raise
    PolicyFileError."""
    doc = read_source(path, _set_texts(args.sets))
    return analyze(doc, world=args.world, mesh=args.mesh)


def load_checked(path: str, args: argparse.Namespace) -> Analysis:
    """Like analyze_file, for commands that need a valid policy: errors raise."""
    try:
        result = analyze_file(path, args)
    except PolicyFileError as err:
        raise UsageError(str(err)) from None
    if result.errors:
        raise PolicyError(result.errors)
    for warning in result.warnings:
        print(warning.render(), file=sys.stderr)
    return result


def print_json(data: Mapping[str, Any] | list[Any]) -> None:
    """``data`` as indented JSON on stdout (orjson's encoder where it takes the data: the
    standard library's indenting encoder is pure Python, seconds for 10,000 ranks)."""
    try:
        import orjson

        text = orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS
                            ).decode("utf-8")
    except (ImportError, TypeError, ValueError):  # not installed; a value orjson refuses
        text = json.dumps(data, indent=2)
    sys.stdout.write(text + "\n")


class _Text:
    """A text stream (stdout replaced by a test, say) taking bytes of UTF-8."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, data: bytes) -> int:
        return int(self.stream.write(data.decode("utf-8")))


def stdout_bytes() -> Any:
    """Standard output for bytes: its buffer, or the stream itself taking decoded text."""
    sys.stdout.flush()
    buffer = getattr(sys.stdout, "buffer", None)
    return buffer if buffer is not None else _Text(sys.stdout)


def load_role_layout(args: argparse.Namespace, command: str,
                     assumed_world: int | None = None) -> tuple[Policy, int]:
    """The checked policy (``--mesh`` replacing every mesh in it) and the world size, for
    commands that look at one role on every rank (explain, nsys-args). Without ``--world``
    and a mesh, ``assumed_world`` is the world size when given (engine-args: one engine
    rank, as validate's warning says), else a usage error."""
    policy = load_checked(args.file, args).policy
    assert policy is not None  # load_checked raised on errors
    if args.mesh:
        policy = policy.with_mesh(args.mesh)
    hint = policy.unknown_role(args.role)
    if hint is not None:
        print(f"policy-engine {command}: warning: role {args.role!r} is not in the "
              f"policy{hint}; it gets the defaults", file=sys.stderr)
    mesh = policy.mesh_for(args.role)
    world = args.world or (mesh_size(mesh) if mesh else None) or assumed_world
    if world is None:
        raise UsageError("give --world N (or a mesh in the policy): how many ranks the role has")
    return policy, world


def check_output(out: str, what: str, force: bool) -> None:
    """Refuse an output path before any work: a folder, or a file already there without
    ``--force``. ``what`` names the file in the message (``the page``)."""
    if os.path.isdir(out):
        raise UsageError(f"{out} is a folder: give {what}'s file name")
    if os.path.lexists(out) and not force:
        raise UsageError(f"{out} exists (--force replaces it)")


def write_output(out: str, data: bytes, force: bool) -> None:
    """Publish ``data`` whole at ``out`` (never over a file without ``force``); a file that
    appeared meanwhile or a write that fails is a usage error naming ``out``."""
    try:
        publish(out, lambda f: f.write(data), force=force)
    except FileExistsError:
        raise UsageError(f"{out} exists (--force replaces it)") from None
    except OSError as err:
        raise UsageError(f"{out}: cannot write: {err.strerror or err}") from None
