#!/usr/bin/env bash
# Test the lowest versions pyproject.toml allows: a fresh venv with exactly the floors of
# pyyaml, attrs and orjson (the package's dependencies) and of jsonschema (a test dependency: the
# reference the engine's validator is compared with), read from pyproject.toml so that the
# two cannot drift, and no torch, running the tests of the loader, the schema, the validator
# and validate against the source tree (tests/test_hostile.py among them: PyYAML 6.0.3 and
# older crash on deep input unless the loader stops it first; the trace reader's orjson path
# against its stdlib path, and the hostile-input tests of every reader).
set -euo pipefail
cd "$(dirname "$0")/.."

floors=$(python3 - <<'PY'
import re
import tomllib

with open("pyproject.toml", "rb") as stream:
    project = tomllib.load(stream)["project"]
sources = {"pyyaml": project["dependencies"], "attrs": project["dependencies"],
           "orjson": project["dependencies"],
           "jsonschema": project["optional-dependencies"]["test"]}
pins = []
for name, specs in sources.items():
    for spec in specs:
        found = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)", spec.strip())
        if found and found.group(1).lower() == name:
            pins.append(f"{found.group(1)}=={found.group(2)}")
            break
    else:
        raise SystemExit(f"no '>=' floor in pyproject.toml for {name}")
print(" ".join(pins))
PY
)

venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
echo "floors: $floors"
"$venv/bin/python" -m pip install -q --disable-pip-version-check $floors pytest hypothesis

# test_check_runtime_passes_where_the_backend_can_run wants torch importable: not here.
PYTHONPATH="$PWD" "$venv/bin/python" -m pytest -q -m "" -p no:cacheprovider \
  tests/test_yaml.py tests/test_loader.py tests/test_hostile.py tests/test_schema.py \
  tests/test_validator.py tests/test_validate.py tests/test_cli.py \
  tests/test_reader_fast.py tests/test_hostile_readers.py tests/test_manifest.py \
  --deselect tests/test_cli.py::test_check_runtime_passes_where_the_backend_can_run
