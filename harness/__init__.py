"""A torchrun-launched distributed reinforcement-learning training harness."""

import sys

from harness.distributed import signals

if sys.argv[:1] == ["-m"]:
    # ``python -m harness.<entry point>`` is starting (sys.argv[0] is "-m" while the module is looked for):
    # a Ctrl-C while it imports torch and Hydra (seconds) ends it at once, without a KeyboardInterrupt
    # traceback from every rank. Programs that merely import the harness keep their own handler.
    signals.quiet_interrupt()
