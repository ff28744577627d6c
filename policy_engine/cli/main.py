"""Entry point: one module per subcommand, each with ``add_parser`` and ``run``."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Sequence

from policy_engine.errors import PolicyError

#: subcommand -> module under policy_engine.cli
COMMANDS: dict[str, str] = {
    "validate": "validate",
    "explain": "explain",
    "schema": "schema_cmd",
    "init": "init",
    "traces": "traces",
    "demo": "demo",
    "nsys-args": "nsys_args",
}

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class UsageError(Exception):
    """Bad command-line arguments or an unreadable file: exit 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="policy-engine",
        description="Validate, explain and run declarative profiling policies.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in COMMANDS.items():
        try:
            mod = importlib.import_module(f"{__package__}.{module}")
        except ModuleNotFoundError as err:
            if err.name != f"{__package__}.{module}":
                raise
            continue
        mod.add_parser(sub, name)
    return parser


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
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse exits 2 on usage errors, 0 on --help
        return int(exit_.code or 0)
    try:
        code: int = args.run(args)
        return code
    except UsageError as err:
        print(f"policy-engine {args.command}: error: {err}", file=sys.stderr)
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
