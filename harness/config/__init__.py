"""The config: its typed schema (Hydra's ConfigStore), the help that explains every
setting, and the resolvers its YAML uses."""

from harness.config.schema import (
    CollectorConfig,
    Config,
    EnvConfig,
    EvalConfig,
    LoggerConfig,
    load,
    register_configs,
)

__all__ = [
    "CollectorConfig",
    "Config",
    "EnvConfig",
    "EvalConfig",
    "LoggerConfig",
    "load",
    "register_configs",
]
