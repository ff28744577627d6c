"""Put the fake torch_npu (tests/fake_torch_npu) in place for one test, then take it away.

A test module wraps :func:`installed_fake` in its own fixture. Any real or earlier
``torch_npu`` modules are set aside and restored afterwards, so a test never sees another
test's fake state.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

FAKE_ROOT = str(Path(__file__).parent / "fake_torch_npu")


def _ours(name: str) -> bool:
    return name == "torch_npu" or name.startswith("torch_npu.")


@contextmanager
def installed_fake(version: str = "2.13.0") -> Iterator[ModuleType]:
    """The fake torch_npu importable as ``torch_npu``, with ``version``'s API surface."""
    saved = {name: mod for name, mod in sys.modules.items() if _ours(name)}
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, FAKE_ROOT)
    try:
        import torch_npu

        torch_npu._fake.reset()
        torch_npu._fake.use_version(version)
        yield torch_npu
    finally:
        for name in [name for name in sys.modules if _ours(name)]:
            del sys.modules[name]
        sys.path.remove(FAKE_ROOT)
        sys.modules.update(saved)
