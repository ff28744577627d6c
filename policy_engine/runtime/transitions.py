"""What a change of schedule action does: the table :class:`~policy_engine.runtime.capture.Capture`
runs its backend calls from."""

from __future__ import annotations

from policy_engine.language.schedule import Action

NONE, WARMUP, RECORD, SAVE = Action.NONE, Action.WARMUP, Action.RECORD, Action.RECORD_AND_SAVE

# What a change of action does, in order: torch.profiler's action_map, for the engine's
# backend calls. ``None`` is "the capture just opened". A change that crosses into another
# schedule cycle first ends the old cycle (old -> NONE), then runs NONE -> new.
PREPARE, START, STEP = "prepare", "start", "step"
SAVE_DONE, SAVE_CUT, DISCARD = "save_complete", "save_partial", "discard"
BEGIN = (START, STEP)
TABLE: dict[tuple[Action | None, Action], tuple[str, ...]] = {
    (None, NONE): (), (None, WARMUP): (PREPARE,), (None, RECORD): BEGIN, (None, SAVE): BEGIN,
    (NONE, NONE): (), (NONE, WARMUP): (PREPARE,), (NONE, RECORD): BEGIN, (NONE, SAVE): BEGIN,
    (WARMUP, NONE): (DISCARD,), (WARMUP, WARMUP): (),
    (WARMUP, RECORD): BEGIN, (WARMUP, SAVE): BEGIN,
    (RECORD, NONE): (SAVE_CUT,), (RECORD, WARMUP): (SAVE_CUT, PREPARE),
    (RECORD, RECORD): (STEP,), (RECORD, SAVE): (STEP,),
    (SAVE, NONE): (SAVE_DONE,), (SAVE, WARMUP): (SAVE_DONE, PREPARE),
    (SAVE, RECORD): (SAVE_DONE, *BEGIN), (SAVE, SAVE): (SAVE_DONE, *BEGIN),
}


def starts_recording(old: Action | None, new: Action) -> bool:
    """Whether going from ``old`` to ``new`` starts recording a cycle: one trace."""
    return START in TABLE[(old, new)]
