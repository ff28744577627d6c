"""policy_engine.errors: the words every message uses, and the one integer check."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from policy_engine.errors import describe, is_int

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=3),
    max_leaves=8)


@given(JSON)
def test_an_integer_is_what_messages_call_an_integer(value: Any) -> None:
    # A file's `true` is a boolean however Python stores it: never step 1 or one byte.
    assert is_int(value) == (describe(value) == "an integer")


def test_a_bool_is_no_integer() -> None:
    assert [is_int(v) for v in (True, False, 0, -1, 1 << 80, 1.0, "1", None)] == \
        [False, False, True, True, True, False, False, False]
