"""A nested config as dotted settings: what a table of settings shows and what two runs' configs
compare by."""

from __future__ import annotations

from typing import Any


def flat(config: Any, prefix: str = "") -> dict[str, Any]:
    """``{"algo": {"lr": 3e-4}}`` as ``{"algo.lr": 3e-4}``: every leaf of a nested dict under its
    dotted key."""
    if not isinstance(config, dict):
        return {prefix: config}
    return {
        key: value
        for k, v in config.items()
        for key, value in flat(v, f"{prefix}.{k}" if prefix else str(k)).items()
    }
