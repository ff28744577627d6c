"""The policy's ``steps`` and ``ranks`` values: parsing, membership and checks.

Both parsers take the raw policy value and raise :class:`SelectorError` with a sub-path
inside that value; callers prepend the value's own JSON path and file position.

StepSet lives in :mod:`policy_engine.steps`, RankSelector in :mod:`policy_engine.ranks`;
this module gathers them with the error both raise.
"""

from __future__ import annotations

from ._selector_base import SelectorError
from .ranks import DIMENSIONS, RankSelector
from .steps import StepSet

__all__ = ["DIMENSIONS", "RankSelector", "SelectorError", "StepSet"]
