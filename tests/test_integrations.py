"""The Lightning and Hugging Face callbacks (docs/integrations.md).

The slow tests run the real frameworks on the CPU for 6 optimizer steps under a policy
that profiles steps 3 and 4, with gradient accumulation (2 micro-batches a step), and
read the result back through the manifests and `policy-engine traces`. The fast ones
check what both callbacks share, with the recording backend.
"""

from __future__ import annotations

import gzip
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from policy_engine import Topology
from policy_engine.analysis.manifests import scan_manifests
from policy_engine.cli.main import main
from policy_engine.integrations._driver import HookDriver
from policy_engine.testing import recording_backend

TRACE_NAME = r"trainer/step{step}/it_rank0-of-1_pid\d+_\d{{17}}\.pt\.trace\.json\.gz"


def policy(out: Path, **role: Any) -> dict[str, Any]:
    body = {"enabled": True, "backend": "torch", "steps": [3, 4],
            "torch": {"activities": ["cpu"]}, **role}
    return {"version": 1, "prefix": "it", "output_dir": str(out), "roles": {"trainer": body}}


def records(out: Path, event: str) -> list[dict[str, Any]]:
    scan = scan_manifests(str(out))
    assert scan.problems == ()
    return [r for r in scan.records if r["event"] == event]


def traces_cli(out: Path, capsys: Any) -> dict[str, Any]:
    capsys.readouterr()  # what the framework printed
    assert main(["traces", str(out), "--format", "json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def trace_events(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    meta = trace["policy_engine"]
    return (json.loads(meta) if isinstance(meta, str) else meta), trace["traceEvents"]


def check_steps_3_and_4(out: Path, capsys: Any, region: str) -> None:
    """Exactly the traces of steps 3 and 4, complete, named and labelled as the policy says,
    each holding its step's two micro-batches."""
    found = sorted(records(out, "trace"), key=lambda r: r["steps"])
    assert [(r["steps"], r["status"], r["role"], r["rank"], r["world"]) for r in found] == [
        ([3], "complete", "trainer", 0, 1), ([4], "complete", "trainer", 0, 1)]
    for record, step in zip(found, (3, 4), strict=True):
        assert re.fullmatch(TRACE_NAME.format(step=step), record["path"]), record["path"]
        meta, events = trace_events(out / record["path"])
        assert (meta["role"], meta["rank"], meta["world"], meta["steps"]) == (
            "trainer", 0, 1, [step])
        names = [e.get("name") for e in events]
        assert names.count(region) == 2  # one range per micro-batch
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.pt.trace.json.gz")) \
        == sorted(r["path"] for r in found)
    assert [c["status"] for c in records(out, "close")] == ["complete", "complete"]
    data = traces_cli(out, capsys)
    assert sorted(t["steps"][0] for t in data["traces"]) == [3, 4]
    assert all(t["exists"] and t["status"] == "complete" for t in data["traces"])
    assert data["interrupted"] == data["unlisted"] == data["missing"] == []


def check_partial_step_3(out: Path, capsys: Any) -> None:
    """Step 3 failed: its trace is saved, marked partial; step 4 never ran."""
    [trace] = records(out, "trace")
    assert (trace["steps"], trace["status"], trace["role"]) == ([3], "partial", "trainer")
    assert re.fullmatch(TRACE_NAME.format(step=3), trace["path"]), trace["path"]
    assert (out / trace["path"]).is_file()
    assert [c["status"] for c in records(out, "close")] == ["partial"]
    data = traces_cli(out, capsys)
    assert [(t["steps"], t["status"]) for t in data["traces"]] == [([3], "partial")]
    assert data["interrupted"] == []


# -- what both callbacks share (fast) ------------------------------------------------
def drive(driver: HookDriver, steps: int, micro: int, fail_at: int | None = None) -> None:
    """What a framework's hooks do: open step n, one inner step per micro-batch, close."""
    driver.start(Topology(rank=0, world=1))
    for n in range(1, steps + 1):
        for _ in range(micro):
            driver.open_step(n)  # every micro-batch's begin hook: the same n
            if n == fail_at:
                error = RuntimeError(f"boom in step {n}")
                driver.finish(error)
                raise error
            driver.inner_step()
        driver.close_step()
    driver.finish()


def test_driver_opens_one_capture_per_profiled_step(tmp_path: Path) -> None:
    driver = HookDriver("trainer", policy(tmp_path), None)
    with recording_backend("torch") as rec:
        drive(driver, steps=6, micro=2)
    assert [info.steps for info in rec.infos] == [(3,), (4,)]
    assert rec.calls.count(("step", 1)) == 2  # two inner steps (0, 1) in each capture
    assert [c["status"] for c in records(tmp_path, "close")] == ["complete", "complete"]
    assert driver.prof is None and driver.step is None


def test_driver_does_nothing_a_step_where_the_plan_is_off(tmp_path: Path) -> None:
    driver = HookDriver("trainer", policy(tmp_path, ranks=[1]), None)  # this is rank 0
    with recording_backend("torch") as rec:
        driver.start(Topology(rank=0, world=2))
        assert driver.live is False
        driver.open_step(3)
        assert driver.step is None  # no step block entered, nothing to close
        driver.inner_step()
        driver.close_step()
        driver.finish()
    assert rec.calls == []


def test_driver_leaves_a_failed_step_partial(tmp_path: Path) -> None:
    driver = HookDriver("trainer", policy(tmp_path), None)
    with recording_backend("torch") as rec, pytest.raises(RuntimeError, match="step 3"):
        drive(driver, steps=6, micro=2, fail_at=3)
    assert [info.steps for info in rec.infos] == [(3,)]
    assert [(r["steps"], r["status"]) for r in records(tmp_path, "trace")] == [
        ([3], "partial")]
    assert driver.prof is None


def test_driver_closes_a_run_that_ended_without_a_word(tmp_path: Path) -> None:
    """A run whose end hook never came (a retry, an exception no hook saw): the next run's
    start saves its open step as partial and puts back what it replaced."""

    class Worker:
        def update(self) -> int:
            return 1

    worker = Worker()
    driver = HookDriver("trainer", policy(tmp_path, regions=["update"]), None)
    with recording_backend("torch"):
        driver.start(Topology(rank=0, world=1))
        assert driver.wrap_regions(worker, ["missing_method"]) == ["update"]
        assert "update" in vars(worker) and worker.update() == 1
        driver.open_step(3)
        driver.start(Topology(rank=0, world=1))
        assert "update" not in vars(worker)
        driver.finish()
    assert [(r["steps"], r["status"]) for r in records(tmp_path, "trace")] == [
        ([3], "partial")]


def test_policy_engine_imports_no_framework() -> None:
    code = ("import sys, policy_engine, policy_engine.integrations, "
            "policy_engine.integrations._driver\n"
            "loaded = {m.split('.')[0] for m in sys.modules}\n"
            "print(sorted(loaded & {'lightning', 'pytorch_lightning', 'transformers'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "[]"


def test_lightning_missing_names_both_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning",
                 "policy_engine.integrations.lightning"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "policy_engine.integrations.lightning")
    with pytest.raises(ImportError, match=r"lightning\.pytorch.*pytorch_lightning"):
        importlib.import_module("policy_engine.integrations.lightning")


# -- Lightning (slow: the real framework) --------------------------------------------
def lightning_module(fail_at: int | None = None) -> Any:
    """A tiny LightningModule; with ``fail_at`` its training_step raises in that step
    (kept as ``module.error``)."""
    L = pytest.importorskip("lightning.pytorch")
    import torch

    class Tiny(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)
            self.error: RuntimeError | None = None

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if self.trainer.global_step + 1 == fail_at:
                self.error = RuntimeError(f"boom in step {fail_at}")
                raise self.error
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Tiny()


def lightning_fit(out: Path, callback: Any, module: Any, micro: int = 2) -> Any:
    """6 optimizer steps of ``micro`` batches each on the CPU; returns the trainer."""
    L = pytest.importorskip("lightning.pytorch")
    import torch

    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=6,
                        accumulate_grad_batches=micro,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        default_root_dir=str(out.parent), callbacks=[callback])
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    return trainer


@pytest.mark.slow
def test_lightning_fit_profiles_steps_3_and_4(tmp_path: Path, capsys: Any) -> None:
    pytest.importorskip("lightning.pytorch")
    from policy_engine.integrations.lightning import PolicyCallback

    out = tmp_path / "profiles"
    callback = PolicyCallback(policy=policy(out), regions=True)
    module = lightning_module()
    assert lightning_fit(out, callback, module).global_step == 6
    check_steps_3_and_4(out, capsys, region="training_step")
    assert "training_step" not in vars(module)  # the region wrapper is gone after fit
    assert callback.profiler is None


@pytest.mark.slow
def test_lightning_exception_in_step_3_is_partial_and_propagates(
        tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("lightning.pytorch")
    from policy_engine.integrations.lightning import PolicyCallback

    out = tmp_path / "profiles"
    file = tmp_path / "profile_policy.json"
    file.write_text(json.dumps(policy(out)))
    monkeypatch.setenv("PROFILE_POLICY", str(file))  # policy=None: the environment's
    callback = PolicyCallback()
    module = lightning_module(fail_at=3)
    with pytest.raises(RuntimeError, match="boom in step 3") as caught:
        lightning_fit(out, callback, module)
    assert caught.value is module.error  # the very exception, unchanged
    check_partial_step_3(out, capsys)
    assert callback.profiler is None


# -- Hugging Face (slow: the real framework) -----------------------------------------
def hf_trainer(out: Path, callbacks: list[Any], fail_at: int | None = None,
               where: str = "forward", micro: int = 2) -> Any:
    """6 optimizer steps of ``micro`` micro-batches each of a tiny GPT-2 on the CPU; with
    ``fail_at`` the model's forward (or the optimizer's step) raises in that step (kept in
    ``trainer.raised``)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import torch

    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64,
                                     n_positions=16, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> dict[str, Any]:
            ids = torch.randint(0, 64, (8,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    args = transformers.TrainingArguments(
        output_dir=str(out.parent / "hf"), max_steps=6, per_device_train_batch_size=2,
        gradient_accumulation_steps=micro, report_to=[], use_cpu=True, save_strategy="no",
        logging_strategy="no", eval_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(),
                                   callbacks=callbacks, optimizers=(optimizer, None))
    trainer.raised = []

    def fail(*_: Any) -> None:
        if trainer.state.global_step + 1 == fail_at:
            trainer.raised.append(RuntimeError(f"boom in step {fail_at} ({where})"))
            raise trainer.raised[-1]

    if where == "forward":
        model.register_forward_pre_hook(fail)
    else:
        optimizer.register_step_pre_hook(fail)
    return trainer


@pytest.mark.slow
def test_transformers_train_profiles_steps_3_and_4(tmp_path: Path, capsys: Any) -> None:
    pytest.importorskip("transformers")
    from policy_engine.integrations.transformers import PolicyCallback

    out = tmp_path / "profiles"
    callback = PolicyCallback(policy=policy(out), regions=True)
    trainer = hf_trainer(out, [callback])
    assert trainer.train().global_step == 6
    check_steps_3_and_4(out, capsys, region="training_step")
    assert "training_step" not in vars(trainer)  # the region wrapper is gone after train
    assert callback.profiler is None


@pytest.mark.slow
@pytest.mark.parametrize(("added", "where"), [
    ("in Trainer(callbacks=...)", "optimizer"),  # guarded by the wrapper of train()
    ("in Trainer(callbacks=...)", "forward"),
    ("by add_callback", "forward"),              # guarded by the wrapper of training_step
])
def test_transformers_exception_in_step_3_is_partial_and_propagates(
        tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch, added: str,
        where: str) -> None:
    pytest.importorskip("transformers")
    from policy_engine.integrations.transformers import PolicyCallback

    out = tmp_path / "profiles"
    file = tmp_path / "profile_policy.json"
    file.write_text(json.dumps(policy(out)))
    monkeypatch.setenv("PROFILE_POLICY", str(file))  # policy=None: the environment's
    callback = PolicyCallback()
    late = added == "by add_callback"
    trainer = hf_trainer(out, [] if late else [callback], fail_at=3, where=where)
    if late:
        trainer.add_callback(callback)
    with pytest.raises(RuntimeError, match="boom in step 3") as caught:
        trainer.train()
    assert caught.value is trainer.raised[0]  # the very exception, unchanged
    check_partial_step_3(out, capsys)
    assert callback.profiler is None
    assert "training_step" not in vars(trainer)  # the run's guard is gone with the run
