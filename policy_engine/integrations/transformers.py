"""Hugging Face: profile ``Trainer.train`` under a policy with one callback.

    from policy_engine.integrations.transformers import PolicyCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[PolicyCallback(role="trainer")])

Outer step ``n`` is the n-th optimizer step, counted from 1: ``state.global_step + 1`` in
``on_step_begin``, which is ``state.global_step`` in ``on_step_end`` (the step HF logs
and names checkpoints with). Each micro-batch ends one inner step (``prof.step()`` in
``on_substep_end`` and in ``on_step_end``), so under ``gradient_accumulation_steps=k`` a
step has k inner steps. ``on_train_end`` closes the profiler. See docs/integrations.md.

HF has no exception hook: nothing is called when an exception leaves a step. So the
callback finds the Trainer that calls it (the ``self`` of a calling frame, in
``on_init_end`` and ``on_train_begin``) and guards that instance's ``train`` method: an
exception leaving ``train()`` closes the open step as ``partial`` and propagates
unchanged. A callback added with ``trainer.add_callback`` after the Trainer was made first
meets it inside a running ``train()``; for that run it guards ``training_step`` (the
forward and backward of each micro-batch) instead.
"""

from __future__ import annotations

import logging
import sys
import weakref
from types import FrameType
from typing import Any

from transformers import Trainer, TrainerCallback

from policy_engine.integrations._driver import HookDriver, guarded, place
from policy_engine.plan.topology import Topology
from policy_engine.runtime.apply import PolicyArg, Profiler

log = logging.getLogger("policy_engine")

#: Methods of the Trainer made regions by ``regions=True``.
REGIONS = ("training_step", "prediction_step")
_FRAMES = 16  # how far up the stack the Trainer may be (it is 2-3 frames up in practice)


def calling_trainer() -> Any:
    """The Trainer whose method called the hook that calls this (None if none is found
    within a few frames: a CallbackHandler driven by hand)."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_FRAMES):
        if frame is None:
            return None
        found = frame.f_locals.get("self")
        if isinstance(found, Trainer):
            return found
        frame = frame.f_back
    return None


def trainer_topology(args: Any, trainer: Any) -> Topology:
    """Where this process sits, as the TrainingArguments say: process index, world size,
    local process index; coordinates from accelerate's DeviceMesh where it has one."""
    mesh = getattr(getattr(trainer, "accelerator", None), "torch_device_mesh", None)
    return place(args.process_index, args.world_size, local_rank=args.local_process_index,
                 mesh=mesh)


class PolicyCallback(TrainerCallback):
    """Profiles ``Trainer.train`` as ``role`` under ``policy``.

    ``policy``: a path, a mapping or a loaded Policy; None reads the file named by
    ``$PROFILE_POLICY`` (profiling is off when that is unset), as ``profile_session``
    does. ``regions=True`` makes the Trainer's ``training_step`` (forward and backward
    of a micro-batch) and ``prediction_step`` (evaluation) regions; regions the policy
    lists are methods of the Trainer too. ``topology`` replaces the one read from the
    TrainingArguments.
    """

    def __init__(self, role: str = "trainer", policy: PolicyArg = None, *,
                 regions: bool = False, topology: Topology | None = None) -> None:
        self.role = role
        self.regions = regions
        self._driver = HookDriver(role, policy, topology)
        self._guarded: weakref.WeakSet[Any] = weakref.WeakSet()
        self._warned = False

    @property
    def profiler(self) -> Profiler | None:
        """The role's profiler while ``train`` runs (None before and after)."""
        return self._driver.prof

    def _failed(self, error: BaseException) -> None:
        self._driver.finish(error)

    def _guard(self, trainer: Any) -> bool:
        """Guard ``trainer.train`` (for good: it only re-raises). False if it already was."""
        if trainer in self._guarded:
            return False
        trainer.train = guarded(trainer.train, self._failed)
        self._guarded.add(trainer)
        return True

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = calling_trainer()
        if trainer is not None:
            self._guard(trainer)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = calling_trainer()
        driver = self._driver
        driver.start(trainer_topology(args, trainer))
        if trainer is None:
            if not self._warned:
                self._warned = True
                log.warning("policy-engine: PolicyCallback found no Trainer calling it: an "
                            "exception inside a step leaves its capture open until the next "
                            "train() or the end of the process (then it is saved as partial)")
            return
        if self._guard(trainer) and driver.live:  # added late: this run is unguarded
            driver.replace(trainer, "training_step", lambda fn: guarded(fn, self._failed))
        driver.wrap_regions(trainer, REGIONS if self.regions else ())

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._driver.open_step(state.global_step + 1)

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._driver.inner_step()  # a micro-batch that did not step the optimizer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        driver = self._driver
        driver.inner_step()  # the micro-batch that stepped the optimizer
        driver.close_step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._driver.finish()
