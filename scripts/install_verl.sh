#!/usr/bin/env bash
# Install verl 0.9.1 into the current Python environment for the verl plugin's tests
# (tests/test_verl_plugin.py, tests/test_verl_e2e.py), keeping the torch already there.
#
# verl itself goes in with --no-deps: its full dependency list (vLLM, wandb, datasets...)
# is far more than `import verl.utils.profiler` needs, and would replace a CPU torch with a
# CUDA one. Then only what that import needs is installed, with the installed torch held at
# its version by a constraints file, so pip can neither upgrade nor replace it.
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

"$python" -m pip install -q --no-deps "verl==${version}"
"$python" -m pip install -q -c "$constraints" \
    "ray>=2.41" \
    "tensordict>=0.8,<=0.10,!=0.9.0" \
    "transformers>=5.5.3,<5.11,!=5.6.0" \
    "omegaconf" \
    "hydra-core" \
    "codetiming" \
    "orjson"

"$python" -c 'import verl.utils.profiler, torch; print("verl", verl.__version__, "with torch", torch.__version__)'
