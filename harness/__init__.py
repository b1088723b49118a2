"""A torchrun-launched distributed reinforcement-learning training harness."""

from harness.core import quick_import

quick_import.install()  # every process starts about a second sooner (see the module)
