"""The one error a command raises for its own input: exit 2."""

from __future__ import annotations


class UsageError(Exception):
    """Bad command-line arguments or an unreadable file: exit 2."""
