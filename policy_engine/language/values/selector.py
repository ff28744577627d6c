"""Shared by the ``steps`` and ``ranks`` parsers: the error they raise and small type helpers."""

from __future__ import annotations

Path = tuple[str | int, ...]

#: Step, rank and index numbers stay below this. A number of thousands of digits is a typo,
#: and refusing it before ``int()`` keeps every later sum and product cheap.
LIMIT = 10**18
_MAX_DIGITS = 18


class SelectorError(ValueError):
    """A malformed ``steps`` or ``ranks`` value; ``path`` locates it inside the value."""

    def __init__(self, message: str, path: Path = ()) -> None:
        super().__init__(message)
        self.message = message
        self.path = path

    def __repr__(self) -> str:
        return f"SelectorError({self.message!r}, path={self.path!r})"



def _shown(text: str) -> str:
    """A number as a message shows it: a long one cut, with its length."""
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text.lstrip('-'))} digits)"


def _too_large(label: str, text: str, plural: str, path: Path) -> SelectorError:
    return SelectorError(f"{label} {_shown(text)}: too large ({plural} are below 10**18)", path)


def _number(text: str, label: str, plural: str, path: Path) -> int:
    """The digits ``text`` (maybe after a ``-``) as an int; more than 18 significant
    digits is an error, found before ``int()`` reads them."""
    if len(text.lstrip("-").lstrip("0")) > _MAX_DIGITS:
        raise _too_large(label, text, plural, path)
    return int(text)


def _bounded_int(value: int, label: str, plural: str, path: Path) -> int:
    """``value`` itself when its magnitude is below :data:`LIMIT`."""
    if abs(value) >= LIMIT:
        try:
            text = str(value)
        except ValueError:  # past Python's int-to-str limit
            text = f"of about {int(value.bit_length() * 0.30103)} digits"
        raise _too_large(label, text, plural, path)
    return value
