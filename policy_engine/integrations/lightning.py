"""Lightning: profile ``Trainer.fit`` under a policy with one callback.

    from policy_engine.integrations.lightning import PolicyCallback

    trainer = L.Trainer(max_steps=1000, callbacks=[PolicyCallback(role="trainer")])

Outer step ``n`` is the n-th optimizer step, counted from 1: ``trainer.global_step + 1``
while it runs, which is ``trainer.global_step`` once it is done (the step in checkpoint
names). It opens in ``on_train_batch_start`` of its first batch and closes in
``on_train_batch_end`` of the batch whose optimizer step advanced ``global_step``; each
batch ends one inner step (``prof.step()``), so under ``accumulate_grad_batches=k`` a step
has k inner steps. ``on_exception`` closes the open step as ``partial`` (Lightning then
re-raises the exception); ``on_fit_end`` closes the profiler. See docs/integrations.md.

Works with ``lightning`` (``lightning.pytorch``) or the older ``pytorch_lightning``.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from policy_engine.integrations._driver import HookDriver, place
from policy_engine.plan.topology import Topology
from policy_engine.runtime.apply import PolicyArg, Profiler


def _import_lightning() -> ModuleType:
    """``lightning.pytorch``, else ``pytorch_lightning``; an ImportError naming both."""
    why = []
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            return importlib.import_module(name)
        except ImportError as err:
            why.append(f"{name}: {err}")
    raise ImportError(
        "policy_engine.integrations.lightning needs Lightning: neither `lightning.pytorch` "
        "(pip install lightning) nor `pytorch_lightning` (pip install pytorch-lightning) "
        f"can be imported ({'; '.join(why)})")


pl = _import_lightning()
_is_overridden = importlib.import_module(
    f"{pl.__name__}.utilities.model_helpers").is_overridden

#: Methods of the LightningModule made regions by ``regions=True`` (those it overrides).
REGIONS = ("training_step", "validation_step")


def trainer_topology(trainer: Any) -> Topology:
    """Where this process sits, as the trainer's strategy says: global rank, world size,
    local rank and node; coordinates from the strategy's DeviceMesh where it has one
    (``ModelParallelStrategy``)."""
    try:
        mesh = getattr(trainer.strategy, "device_mesh", None)
    except RuntimeError:  # ModelParallelStrategy before its processes are set up
        mesh = None
    return place(trainer.global_rank, trainer.world_size, local_rank=trainer.local_rank,
                 node=trainer.node_rank, mesh=mesh)


class PolicyCallback(pl.Callback):  # type: ignore[misc,name-defined]
    """Profiles ``Trainer.fit`` as ``role`` under ``policy``.

    ``policy``: a path, a mapping or a loaded Policy; None reads the file named by
    ``$PROFILE_POLICY`` (profiling is off when that is unset), as ``profile_session``
    does. ``regions=True`` makes the LightningModule's ``training_step`` and
    ``validation_step`` regions (ranges in the trace); regions the policy lists are
    methods of the LightningModule too. ``topology`` replaces the one read from the
    trainer's strategy.
    """

    def __init__(self, role: str = "trainer", policy: PolicyArg = None, *,
                 regions: bool = False, topology: Topology | None = None) -> None:
        super().__init__()
        self.role = role
        self.regions = regions
        self._driver = HookDriver(role, policy, topology)

    @property
    def profiler(self) -> Profiler | None:
        """The role's profiler while ``fit`` runs (None before and after)."""
        return self._driver.prof

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._driver.start(trainer_topology(trainer))
        defaults = [n for n in REGIONS if self.regions and _is_overridden(n, pl_module)]
        self._driver.wrap_regions(pl_module, defaults)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        # The same n for every batch of one optimizer step (gradient accumulation).
        self._driver.open_step(trainer.global_step + 1)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        driver = self._driver
        driver.inner_step()
        if driver.step is not None and trainer.global_step >= driver.step:
            driver.close_step()  # this batch's optimizer step completed step n

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._driver.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._driver.finish(exception)
