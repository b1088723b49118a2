"""Algorithms and weight sync schemes from outside the package.

``HARNESS_PLUGINS=my_pkg.algo,my_pkg.scheme`` names modules that every process imports before it
composes a config: each adds its entries to ``ALGOS`` or ``SCHEMES`` (and may store its YAML in
Hydra's ConfigStore), exactly as a module inside ``harness/algos/`` or ``harness/sync/`` does.
An environment variable, not a setting: the schemas must be registered before Hydra composes
the command line, and torchrun hands the variable to every rank. (An env needs no plugin:
``env.id=my_pkg.envs:MyEnv-v0`` imports ``my_pkg.envs`` first, as ``gym.make`` does.)
"""

from __future__ import annotations

import importlib
import os

VARIABLE = "HARNESS_PLUGINS"


def import_plugins() -> list[str]:
    """Import the modules ``HARNESS_PLUGINS`` names (comma-separated); returns their names."""
    names = [name.strip() for name in os.environ.get(VARIABLE, "").split(",") if name.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ValueError(
                f"{VARIABLE}={os.environ[VARIABLE]}: cannot import {name} ({e}). Name modules "
                "that the harness's Python can import (pip install them, or set PYTHONPATH)"
            ) from e
    return names
