"""Entry point: one module per subcommand, each with ``add_parser`` and ``run``."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from policy_engine.analysis.errors import AnalysisError
from policy_engine.cli.usage import UsageError
from policy_engine.errors import PolicyError, printable

#: subcommand -> (module under policy_engine.cli, one line of help), in the order of a
#: user's work (``--help`` lists them so): write and check a policy, launch, steer the
#: running job, then read what it wrote.
COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("init", "write a starter policy"),
    "from-verl": ("from_verl", "write the policy equivalent to a verl config's profiler settings"),
    "schema": ("schema_cmd", "print the JSON Schema"),
    "validate": ("validate", "check policy files"),
    "explain": ("explain", "show what a role does on every rank"),
    "nsys-args": ("nsys_args", "print the nsys profile arguments for a role"),
    "engine-args": ("engine_args", "print a rollout engine's launch profiler settings"),
    "demo": ("demo", "profile a small CPU training run"),
    "trigger": ("trigger", "ask running processes to capture their next steps"),
    "traces": ("traces", "list the traces under a folder"),
    "analyze": ("analyze", "per window and rank: step time, compute, communication, straggler"),
    "timeline": ("timeline", "each training step: every role's phases on one clock, who waits "
                 "for whom"),
    "compare": ("compare", "what a change did between two runs, window by window"),
    "report": ("report", "write a static HTML page of a run's captures"),
    "merge": ("merge", "join the per-rank traces of one capture window"),
    "memory-plot": ("memory_plot", "draw a memory snapshot as a self-contained HTML page"),
}

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser, with the options of the command ``argv`` names: only that command's
    module is imported, so each command pays for what it runs."""
    parser = argparse.ArgumentParser(
        prog="policy-engine",
        description="Validate, explain and run declarative profiling policies.")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="show the installed version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    for name, (module, help) in COMMANDS.items():
        if name == chosen:
            importlib.import_module(f"policy_engine.cli.{module}").add_parser(sub, name, help)
        else:
            sub.add_parser(name, help=help)
    return parser


class _Version(argparse.Action):
    """``--version``: the version is looked up when asked for, not for every command (the
    distribution's metadata takes longer to read than most commands take to run)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(f"{parser.prog} {_version()}")
        parser.exit()


def _version() -> str:
    """The installed distribution's version (the package's own where it is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("policy-engine")
    except metadata.PackageNotFoundError:
        from policy_engine import __version__

        return __version__


def _tolerant_output() -> None:
    """File names and values that the terminal's encoding cannot show are escaped, not a
    UnicodeEncodeError halfway through a report."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            # A stream replaced by one that cannot be reconfigured keeps its errors.
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    _tolerant_output()
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse exits 2 on usage errors, 0 on --help
        return int(exit_.code or 0)
    try:
        code: int = args.run(args)
        return code
    except (UsageError, AnalysisError) as err:
        # Messages may quote the files read (names from manifests): each line printable.
        said = "\n".join(map(printable, str(err).split("\n")))
        print(f"policy-engine {args.command}: error: {said}", file=sys.stderr)
        return EXIT_USAGE
    except PolicyError as err:
        print(err, file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    except Exception as err:  # anything else is our bug, not the user's
        import traceback

        traceback.print_exc()
        print(f"policy-engine: internal error: {err!r}", file=sys.stderr)
        return EXIT_INTERNAL


def entry() -> None:
    sys.exit(main())
