"""The reading side's own errors."""

from __future__ import annotations


class AnalysisError(Exception):
    """What was asked of a run folder cannot be answered: the folder is not there, holds
    no traces, or no window matches the role and step asked for. The message says which,
    and what there is instead."""
