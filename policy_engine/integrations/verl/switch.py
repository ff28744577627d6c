"""Whether the verl plugin drives verl's profilers in this process, and how it stops.

Anything that keeps the plugin from driving a verl profiler at run time (a policy that does
not load, a worker whose role the policy misspells, a malformed
``PROFILE_POLICY_VERL_ROLES``, a profiler config asking what a policy cannot say, a fault
while a window opens or a stage starts) turns profiling off in the process, verl's own
profiler included: one ERROR line on the ``policy_engine.verl`` logger names the worker,
what is wrong and what to do, and training goes on. The one exception is ``on_error: raise``
in a policy that loads (the worker's role's, or ``defaults``' when no role could be told):
then the failure propagates to verl, as the user asked; the caller decides that
(:func:`raises`). A policy that does not load has no ``on_error`` to read: off.
"""

from __future__ import annotations

import logging
import os

from policy_engine.errors import PolicyError
from policy_engine.language.load import ENV_FILE, load_policy
from policy_engine.language.model import Policy
from policy_engine.language.read.overrides import ENV_OVERRIDES
from policy_engine.runtime.apply import resolve_policy
from policy_engine.runtime.process.state import warn_once, warned

said = logging.getLogger("policy_engine.verl")

#: The one-time key (``warn_once``) of the line that says the plugin turned itself off;
#: ``runtime.process.state.reset`` turns it back on, for tests.
OFF = ("verl-plugin-off",)


def is_off() -> bool:
    """Whether a failure turned the plugin off in this process."""
    return warned(OFF)


def turn_off(who: str, why: str) -> None:
    """Turn the plugin off in this process, saying so once: ``who`` (the verl worker or
    server) cannot be profiled because ``why`` (what is wrong, and what to do)."""
    warn_once(OFF, "policy-engine: %s cannot be profiled: %s; profiling is off in this "
              "process (verl's own profiler too) and training goes on", who, why,
              level=logging.ERROR, logger=said)


def raises(policy: Policy, role: str) -> bool:
    """Whether a failure while driving ``role`` propagates (``on_error: raise``; a role the
    policy does not name, or ``""`` when none could be told, reads ``defaults``)."""
    return policy.role(role).on_error == "raise"


def failure(err: BaseException) -> str:
    """What a failure says: the plugin's own errors (ValueError, PolicyError) say what to do
    in their text; anything else by its type and text, and how to train without it."""
    if isinstance(err, PolicyError):
        return "; ".join(p.message for p in err.problems)
    if isinstance(err, ValueError):
        return str(err)
    return f"{type(err).__name__}: {err} (unset {ENV_FILE} to train without the plugin)"


def policy(who: str) -> Policy | None:
    """The policy ``PROFILE_POLICY`` names, its warnings said once per process; None when
    that is unset, when the plugin is off, or when the policy does not load (then off)."""
    path = os.environ.get(ENV_FILE)
    if not path or is_off():
        return None
    try:
        loaded = load_policy(path)
    except PolicyError as err:
        errors = [p for p in err.problems if p.severity == "error"] or list(err.problems)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        turn_off(who, f"the policy {ENV_FILE}={path} does not load: {errors[0].render()}"
                      f"{more}; `policy-engine validate {path}` (with the same "
                      f"{ENV_OVERRIDES}) lists every problem")
        return None
    except Exception as err:
        turn_off(who, f"the policy {ENV_FILE}={path} does not load: {failure(err)}")
        return None
    return resolve_policy(loaded)  # says the policy's warnings, once per process
