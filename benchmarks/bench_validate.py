"""`policy-engine validate FILE` for each policy in policies/, timed as a user runs it.

    python benchmarks/bench_validate.py [--runs N] [--no-plugins]

Each time is also given as a ratio to `python -c "import yaml, attr"` measured in the same
run and the same environment (the least a command of this package pays). Target: <= 3x.

The second environment is a fresh venv under a temporary folder with this project and
jsonschema's optional format plugins installed (`jsonschema[format]`, `rfc3987-syntax`: what
Jupyter environments pull in, and what `import jsonschema` then imports too; seconds on some
machines). Validation never imports jsonschema, so its ratio must not move; the run prints
what `import jsonschema` costs there for comparison. The venv is skipped, with a message,
when pip cannot install there (no index, no network) or with --no-plugins.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POLICIES = sorted((ROOT / "policies").glob("*.yaml"))
TARGET = 3.0
PLUGINS = ["jsonschema[format]", "rfc3987-syntax"]
# Bytecode is cached in a folder of the run's own (a checkout gets no __pycache__), even
# where PYTHONDONTWRITEBYTECODE is set: an installed package runs from cached bytecode.
# No override from the environment: the files are measured.
ENV = {k: v for k, v in os.environ.items()
       if k not in ("PYTHONDONTWRITEBYTECODE", "PROFILE_POLICY_SET", "PROFILE_POLICY")}


def timed(argv: list[str], runs: int, cwd: Path = ROOT) -> float:
    """Median seconds of ``runs`` runs of ``argv`` (which must succeed), after one that
    leaves the bytecode cached, as an installed package has it."""
    times = []
    for _ in range(runs + 1):
        began = time.perf_counter()
        subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=True, env=ENV)
        times.append(time.perf_counter() - began)
    return statistics.median(times[1:])


def measure(label: str, python: Path, runs: int) -> float:
    """Print the times of one environment; return its worst ratio."""
    cli = python.parent / "policy-engine"
    command = [str(cli)] if cli.exists() else [str(python), "-m", "policy_engine"]
    base = timed([str(python), "-c", "import yaml, attr"], runs)
    print(f"{label}: python -c \"import yaml, attr\": {base * 1000:.0f} ms (the unit)")
    worst = 0.0
    for path in POLICIES:
        took = timed([*command, "validate", str(path)], runs)
        worst = max(worst, took / base)
        print(f"  policy-engine validate {path.relative_to(ROOT)}: {took * 1000:.0f} ms "
              f"= {took / base:.2f}x")
    print(f"  worst ratio {worst:.2f}x (target <= {TARGET:.0f}x)")
    return worst


def plugin_env(folder: Path) -> Path | None:
    """A venv with this project and jsonschema's format plugins, or None (with why)."""
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    python = folder / "bin" / "python"
    source = folder / "src"  # a copy: building leaves nothing in the checkout
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "__pycache__", "*.egg-info", ".*_cache", ".hypothesis", "build",
        "dist"))
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", str(source), *PLUGINS],
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        print(f"skipping the plugin environment: pip cannot install there ({tail[0]})")
        return None
    return python


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per command (median)")
    parser.add_argument("--no-plugins", action="store_true",
                        help="skip the venv with jsonschema's format plugins")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ENV["PYTHONPYCACHEPREFIX"] = os.path.join(tmp, "pycache")
        worst = measure(f"this environment ({sys.prefix})", Path(sys.executable), args.runs)
        python = None if args.no_plugins else plugin_env(Path(tmp) / "venv")
        if python is not None:
            cost = timed([str(python), "-c", "import jsonschema"], args.runs)
            print(f"plugin environment: python -c \"import jsonschema\": {cost * 1000:.0f} ms "
                  "(what validate would pay if it imported jsonschema)")
            worst = max(worst, measure("plugin environment", python, args.runs))
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
