"""verl's own example profiling scripts, captured by verl and through the plugin.

Each script of verl's examples/profile/ (its overrides in test_from_verl.SCRIPTS) is composed
by Hydra from the installed verl wheel and converted with ``policy-engine from-verl``. The
verl-shaped job (tests/verl_scripts/verl_worker.py) then runs twice on a small torchrun world:
once with verl's own profiler built from the composed actor and ref profiler blocks, once
through the plugin with the converted policy. Both must capture the same (stage, step, rank)
windows with the same tool: torch traces for the torch script, torch_npu folders (the fake
torch_npu of tests/fake_torch_npu) for the npu scripts.

The scripts write to /data/profile_data; here save_path is a relative folder, added on the
command line as a user moving the output would, so each run writes under its own folder.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from job_env import child_env
from npu_fixtures import FAKE_ROOT
from test_from_verl import SCRIPTS

from policy_engine import load_policy
from policy_engine.cli.main import main

pytest.importorskip("hydra", reason="the verl tests need hydra-core (pip install hydra-core)")
pytest.importorskip("verl.utils.profiler", reason="the verl tests need verl==0.9.1")

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "verl_scripts" / "verl_worker.py"
TIMEOUT = 300
SAVE = "profile_data"
ACTOR = "actor_rollout_ref.actor.profiler"
REF = "actor_rollout_ref.ref.profiler"
STAGES = ("actor_compute_log_prob", "ref_compute_log_prob", "actor_update")
#: Ranks of the small world each script runs on: enough that its rank selection both picks
#: and leaves out ranks where it names some (npu_discrete profiles ranks [1, 2]).
WORLDS = {"torch": 2, "npu_discrete": 3, "npu_e2e": 2}
#: verl's torch trace names: <worker>_<stage>_step<N>_rank<R>-of-<W>_pid<P>_<time>.json.gz
TORCH_NAME = re.compile(r"actor-rollout-ref_(?P<stage>[a-z-]+)_step\d+_rank\d+-of-\d+_pid\d+_"
                        r"\d+(?:_mb[\d-]+)?\.json\.gz")


@pytest.fixture(scope="module")
def composed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """Each script's config as Hydra saves it (for from-verl) and resolved (for verl)."""
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    folder = tmp_path_factory.mktemp("composed")
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    out = {}
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        for name, overrides in SCRIPTS.items():
            cfg = compose(config_name="ppo_trainer",
                          overrides=[*overrides, f"global_profiler.save_path={SAVE}"])
            path = folder / f"{name}.yaml"
            path.write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")
            OmegaConf.resolve(cfg)  # as verl's main_ppo does before it builds the workers
            out[name] = (path, cfg)
    return out


def convert(path: Path, cwd: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """``policy-engine from-verl`` run from ``cwd`` (where verl's workers would start), the
    policy validated."""
    policy = cwd / "profile_policy.yaml"
    here = os.getcwd()
    os.chdir(cwd)
    try:
        assert main(["from-verl", str(path), "-o", str(policy)]) == 0
        assert main(["validate", str(policy)]) == 0
    finally:
        os.chdir(here)
    capsys.readouterr()
    return policy


def block(cfg: Any, key: str) -> dict[str, Any]:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.select(cfg, key))  # type: ignore[return-value]


def run_job(root: Path, job: dict[str, Any], world: int, npu: bool,
            policy: Path | None = None) -> list[dict[str, Any]]:
    """One torchrun run of the verl-shaped job in ``root``; each rank's report."""
    reports = root / "reports"
    reports.mkdir(parents=True)
    env = child_env()
    if npu:
        env["PYTHONPATH"] = os.pathsep.join([FAKE_ROOT, env["PYTHONPATH"]])
    if policy is not None:
        env["PROFILE_POLICY"] = str(policy)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={world}", str(WORKER), json.dumps({**job, "report_dir": str(reports)})],
        cwd=root, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads((reports / f"report{rank}.json").read_text()) for rank in range(world)]


def verl_captures(root: Path, reports: list[dict[str, Any]]) -> dict[tuple[str, int, int], Path]:
    """verl's captures by (stage or 'train', step, rank): a torch trace names its stage, a
    torch_npu folder sits under it (save_path/<stage>/..._ascend_pt); the step is the one
    during which the rank wrote it."""
    found = {}
    for report in reports:
        for step, rel in report["outputs"]:
            path = root / SAVE / rel
            if path.name.endswith("_ascend_pt"):
                stage = Path(rel).parent.as_posix()
            else:
                match = TORCH_NAME.fullmatch(path.name)
                assert match, rel
                stage = match["stage"].replace("-", "_")
            key = (stage, step, report["rank"])
            assert key not in found, key
            found[key] = path
    return found


def plugin_captures(root: Path) -> dict[tuple[str, int, int], dict[str, Any]]:
    """The plugin's manifest trace lines by (region or 'train', step, rank)."""
    found = {}
    for manifest in sorted((root / SAVE / "manifests").glob("*.jsonl")):
        for line in map(json.loads, manifest.read_text().splitlines()):
            if line["event"] == "trace":
                key = (line["region"] or "train", line["steps"][0], line["rank"])
                assert key not in found, key
                found[key] = line
    return found


def annotations(path: Path) -> set[str]:
    """The range names (record_function) in a torch trace."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return {e["name"] for e in json.load(f)["traceEvents"]
                if e.get("cat") == "user_annotation"}


def npu_output(folder: Path) -> tuple[set[str], dict[str, Any]]:
    """What torch_npu wrote in a capture folder: its files, and the experimental config the
    profiler was given (profiler_info.json) with the mstx switch under one name (verl passes
    ``msprof_tx``, the engine ``mstx``, torch_npu's newer name of the same switch)."""
    config = json.loads((folder / "profiler_info.json").read_text())["experimental_config"]
    config["tx"] = any([config.pop("_msprof_tx"), config.pop("_mstx")])
    files = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    return files, config


def expected(cfg: Any, world: int) -> set[tuple[str, int, int]]:
    """The windows the composed actor block asks for: its stages (discrete) or the whole
    step, on its ranks (rank 0 when it names none), at global_profiler.steps."""
    actor = block(cfg, ACTOR)
    tool = actor["tool"]
    ranks = range(world) if actor["all_ranks"] else actor["ranks"] or [0]
    stages = STAGES if actor["tool_config"][tool]["discrete"] else ("train",)
    return {(s, step, r) for s in stages for step in cfg.global_profiler.steps for r in ranks}


@pytest.mark.parametrize("script", list(WORLDS))
def test_plugin_captures_what_verl_captures(script: str, composed: dict[str, tuple[Path, Any]],
                                            tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path, cfg = composed[script]
    world = WORLDS[script]
    tool = cfg.global_profiler.tool
    steps = list(cfg.global_profiler.steps)
    # The trainer calls start/stop_profile at global_profiler.steps; one step runs after.
    job = {"profiler": block(cfg, ACTOR), "ref_profiler": block(cfg, REF), "steps": steps,
           "total_steps": max(steps) + 1, "mini_batches": 4}
    verl_root, plugin_root = tmp_path / "verl", tmp_path / "plugin"
    verl_root.mkdir()
    plugin_root.mkdir()
    policy = convert(path, plugin_root, capsys)
    assert load_policy(policy).output_dir == str(plugin_root / SAVE)

    verl_reports = run_job(verl_root, job, world, tool == "npu")
    plugin_reports = run_job(plugin_root, job, world, tool == "npu", policy)
    assert {r["outcome"] for r in verl_reports + plugin_reports} == {"ok"}
    theirs, ours = verl_captures(verl_root, verl_reports), plugin_captures(plugin_root)
    assert set(ours) == set(theirs) == expected(cfg, world)
    # the ref's block joins the actor's windows where it is enabled (verl's hybrid worker)
    roles = ["actor", "ref"] if cfg.actor_rollout_ref.ref.profiler.enable else ["actor"]
    for key, line in ours.items():
        assert (line["role"], line["roles"], line["status"]) == ("actor", roles, "complete"), key
        mine = plugin_root / SAVE / line["path"]
        if tool == "torch":
            assert mine.name.endswith(".json.gz")
            names, verl_names = annotations(mine), annotations(theirs[key])
            assert set(STAGES) <= names and set(STAGES) <= verl_names
            assert {n for n in names if n.startswith("mini_batch")} == {
                n for n in verl_names if n.startswith("mini_batch")} == {
                f"mini_batch{i}" for i in range(4)}
        else:
            # the same torch_npu output and settings; the engine adds its own metadata
            assert mine.name.endswith("_ascend_pt") and theirs[key].name.endswith("_ascend_pt")
            (files, config), (verl_files, verl_config) = npu_output(mine), npu_output(theirs[key])
            assert config == verl_config, key
            assert files - verl_files == {"profiler_metadata.json"}, key
            assert verl_files <= files, key


def test_torch_memory_script_watches_the_ranks_verl_watches(
        composed: dict[str, tuple[Path, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """verl's TorchMemoryProfiler and the engine's memory backend both need CUDA to record
    or dump anything, so on a CPU machine this compares their decisions: per rank, whether
    it watches for out-of-memory (and records allocator history), and the steps at which it
    dumps a snapshot. The dumps themselves need a GPU and are not made here."""
    from omegaconf import OmegaConf
    from verl.utils import omega_conf_to_dataclass
    from verl.utils.profiler import DistProfiler, ProfilerConfig

    path, cfg = composed["torch_memory"]
    monkeypatch.chdir(tmp_path)
    policy = convert(path, tmp_path, capsys)
    world, steps = 2, list(cfg.global_profiler.steps or [])
    for role, key in (("actor", ACTOR), ("ref", REF)):
        spec = load_policy(policy).role(role)
        assert spec.backends == ("memory",)
        assert spec.blocks["memory"]["on_oom"] is True  # verl always watches for OOM
        assert main(["explain", str(policy), "--role", role, "--world", str(world),
                     "--steps", "1-8", "--format", "json"]) == 0
        explained = {r["rank"]: r for r in json.loads(capsys.readouterr().out)["ranks"]}
        omega = OmegaConf.select(cfg, key)
        for rank in range(world):
            prof = DistProfiler(rank=rank, config=omega_conf_to_dataclass(
                omega, dataclass_type=ProfilerConfig), tool_config=omega_conf_to_dataclass(
                omega.tool_config.torch_memory), save_file_prefix="actor_rollout_ref")
            dumps = []
            for step in steps:  # the trainer's start/stop_profile at global_profiler.steps
                prof.start(role="train", profile_step=step)
                if prof._impl.this_step:
                    dumps.append(step)
                prof._impl.this_step = False  # a dump needs CUDA: verl's stop is not run
            watches = prof._impl._should_profile_this_rank()
            assert explained[rank]["profiled"] == watches, (role, rank)
            if watches:
                assert explained[rank]["backends"] == ["memory"]
                assert explained[rank]["steps"] == dumps, (role, rank)
