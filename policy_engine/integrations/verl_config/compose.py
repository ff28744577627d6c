"""An uncomposed Hydra config (verl's own ``verl/trainer/config/ppo_trainer.yaml``) made
into the composed one verl's trainer runs with, by Hydra itself.

Such a file holds a top-level ``defaults:`` list naming the files Hydra composes it from;
read as it stands, it has none of the profiler blocks they hold, and converting it would
write a policy that profiles nothing. Hydra (hydra-core, installed wherever verl is)
composes it as ``python -m verl.trainer.main_ppo --config-path DIR --config-name NAME``
does with no override on the command line; without Hydra the file is refused, naming
what to pass instead: the ``.hydra/config.yaml`` Hydra saves in a run's folder.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from policy_engine.errors import Location
from policy_engine.language.read.document import PolicyFileError

#: What to pass instead of a config that cannot be composed here.
INSTEAD = ("pass the composed config Hydra saves in the run's folder (.hydra/config.yaml), "
           "or install hydra-core (pip install hydra-core) for from-verl to compose it")


def uncomposed(data: Mapping[str, Any]) -> bool:
    """Whether ``data`` is a Hydra config still to be composed (Hydra drops ``defaults``
    from the config it composes)."""
    return isinstance(data.get("defaults"), list)


def compose(path: str) -> dict[str, Any]:
    """The config Hydra composes from ``path`` (interpolations unresolved, as Hydra saves
    it). Raises PolicyFileError when Hydra is not installed or cannot compose it."""
    where = Location(path)
    folder, name = os.path.split(os.path.abspath(path))
    stem, ext = os.path.splitext(name)
    if ext != ".yaml":
        raise PolicyFileError.single(
            f"{path} is an uncomposed Hydra config (a top-level defaults: list), and Hydra "
            f"composes .yaml files only: {INSTEAD}", where)
    try:
        from hydra import compose as hydra_compose
        from hydra import initialize_config_dir
        from omegaconf import OmegaConf
    except ImportError:
        raise PolicyFileError.single(
            f"{path} is an uncomposed Hydra config (its top-level defaults: list names the "
            f"files it is made from, which hold verl's profiler settings), and hydra-core is "
            f"not installed here: {INSTEAD}", where) from None
    try:
        with initialize_config_dir(config_dir=folder, version_base=None):
            config = hydra_compose(config_name=stem)
        data = OmegaConf.to_container(config, resolve=False)
    except Exception as err:  # Hydra's and OmegaConf's errors are many
        raise PolicyFileError.single(
            f"Hydra cannot compose {path}: {type(err).__name__}: {err}", where) from None
    if not isinstance(data, dict):
        raise PolicyFileError.single(f"Hydra composed {path} into no mapping", where)
    return {str(key): value for key, value in data.items()}
