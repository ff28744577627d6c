#!/usr/bin/env bash
# Install verl 0.9.1 into the current Python environment for the verl plugin's tests
# (tests/test_verl_plugin.py, tests/test_verl_e2e.py, ...), keeping the torch already there.
#
# verl's full dependency list (vLLM, wandb, datasets...) is far more than
# `import verl.utils.profiler` needs, and would replace a CPU torch with a CUDA one. So
# what that import needs goes in first, then verl itself with --no-deps, and the script
# says which of verl's requirements it left out (`pip check` lists them too).
#
# A constraints file holds what is installed and must not move: torch, at its exact build
# (2.13.0+cpu stays the CPU wheel), and packaging, which the environment's other packages
# need as it is (virtualenv, under pre-commit, needs 26.3 or later). verl allows tensordict
# 0.8 to 0.10; 0.9.1 and later need pyvers 0.1, which caps packaging below 26, so 0.8 is
# asked for by name (left to find that itself, pip's resolver backtracks for many minutes).
# verl goes in last, with --no-deps (a verl already there is removed first), so that pip's
# resolver does not list verl's left-out requirements as conflicts of the install before.
#
# Environment:
#   PYTHON        the interpreter whose environment gets verl (default: python)
#   VERL_VERSION  verl's version (default 0.9.1: the one the plugin's tests pin)
#
# Exit status: 0 when `import verl.utils.profiler` works afterwards; 2 when torch is not
# installed (install it first: the CPU wheel for tests); anything else is pip's own.
set -euo pipefail

python=${PYTHON:-python}
version=${VERL_VERSION:-0.9.1}

torch_version=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null) || {
    echo "install_verl.sh: torch is not installed in $("$python" -c 'import sys; print(sys.prefix)'): install it first" >&2
    exit 2
}

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
# A local version (2.13.0+cpu) pins exactly that build.
echo "torch==${torch_version}" > "$constraints"
"$python" - >> "$constraints" <<'PY'
from importlib import metadata

try:
    print(f"packaging=={metadata.version('packaging')}")
except metadata.PackageNotFoundError:
    pass  # nothing installed needs it yet: pip picks one
PY

if "$python" -c 'import importlib.metadata as m; m.version("verl")' 2>/dev/null; then
    "$python" -m pip uninstall -q -y verl
fi
"$python" -m pip install -q -c "$constraints" \
    "ray>=2.41" \
    "tensordict>=0.8,<0.9" \
    "transformers>=5.5.3,<5.11,!=5.6.0" \
    "omegaconf" \
    "hydra-core" \
    "codetiming" \
    "orjson"
"$python" -m pip install -q --no-deps "verl==${version}"

"$python" - <<'PY'
import importlib.metadata as metadata
import re

import torch
import verl.utils.profiler  # noqa: F401 - what the plugin's tests need

missing = []
for requirement in metadata.requires("verl") or []:
    if "extra ==" in requirement:
        continue
    name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        missing.append(name)
print(f"verl {metadata.version('verl')} with torch {torch.__version__}, without what "
      f"`import verl.utils.profiler` does not need: {', '.join(missing) or 'nothing'}")
PY
