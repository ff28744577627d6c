"""A local Ray cluster for the tests, its start-up tried again where Ray's own timeout hit.

Ray gives its raylet a fixed 30 s to register, which a loaded machine can miss: that
failure of Ray's start-up (and only that) is tried again, up to ``tries`` times. Used by
ray_driver.py (a script of this folder) and by tests/test_channel_ray.py.
"""

from __future__ import annotations

import sys
from typing import Any


def start_ray(tries: int = 3, **init: Any) -> None:
    """``ray.init(**init)``, tried again after Ray's start-up timed out."""
    import ray  # here: a test module imports this before it skips without Ray

    for attempt in range(1, tries + 1):
        try:
            ray.init(**init)
            return
        except Exception as err:
            ray.shutdown()
            if "timed out during startup" not in str(err) or attempt == tries:
                raise
            print(f"ray.init: {err} (try {attempt} of {tries})", file=sys.stderr)
