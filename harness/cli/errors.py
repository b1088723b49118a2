"""The front door of the Hydra entry points: one voice per mistake, help that explains every
setting.

All ranks of a job compose the same config from the same command line, so a
mistake in it is met by every rank at once. Rank 0 alone says it, in one
message without a traceback, and every rank exits with status 2 (a usage
error, as argparse's), which ``harness.cli.launch`` reads to end the job without
torchrun's report of "failed" ranks. A failure that is not the command's (a
bug, a peer that died) keeps its traceback. ``HYDRA_FULL_ERROR=1`` shows a
mistake's traceback too.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException, MissingConfigException
from omegaconf import open_dict, read_write
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    MissingMandatoryValue,
    OmegaConfBaseException,
)

from harness.cli.usage import HELP_FLAGS, PRINTING_FLAGS, USAGE_ERROR
from harness.config.help import CONF, help_text, unknown_option, unknown_setting

# HYDRA_FULL_ERROR=1 as the user set it (run() sets it for Hydra): a mistake's traceback is shown
# too.
_tracebacks = False


def speaks() -> bool:
    """Rank 0 of a job (torchrun's ``RANK``, srun's ``SLURM_PROCID``), or a process on its own."""
    return os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0"


NULL_GROUP = "Config group override must be a string or a list"  # Hydra's words for group=null

# How long a rank that stays silent about a mistake waits for the rank that says it (below).
SPEAKER_WAIT_S = 20.0


def refuse(e: BaseException, speaker: bool | None = None) -> NoReturn:
    """A mistake: said once, without a traceback (by rank 0, unless ``speaker`` says whether this
    rank is the one to say it); every rank exits with status 2.

    The silent ranks leave last. torchrun's agent stops every rank as soon as one exits with an
    error, so a silent rank that found the mistake first would have the speaker stopped before
    it printed: the job would end without a word. A silent rank waits instead, with SIGTERM back
    to its default action, until the agent stops it when the speaker has exited (at most
    ``SPEAKER_WAIT_S``, for ranks that no agent watches, as under srun alone)."""
    if speaks() if speaker is None else speaker:
        print(f"error: {explain(e)}", file=sys.stderr, flush=True)
        sys.exit(USAGE_ERROR)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    time.sleep(SPEAKER_WAIT_S)
    sys.exit(USAGE_ERROR)


@contextmanager
def user_errors(speaker: bool | None = None) -> Iterator[None]:
    """Start-up: a bad value, layout or run directory found here is the command's mistake, not a
    bug. It exits from inside the job, before Hydra would report a failed job. ``speaker``: for a
    check that only some ranks make (a collector's device), whether this rank is the one of them to
    say it."""
    try:
        yield
    except (ValueError, OmegaConfBaseException) as e:
        if _tracebacks:
            raise
        refuse(e, speaker)


def explain(e: BaseException) -> str:
    """One message for a mistake, whichever of Hydra, OmegaConf or the harness found it."""
    cause = e.__cause__
    if NULL_GROUP in str(e):
        return (
            "a config group takes an option (group=option); to choose none, leave the group out "
            "of the command (experiment=null or +experiment=null is refused by Hydra)"
        )
    if isinstance(e, MissingConfigException) and (
        found := re.search(r"Could not find '([^/']+)/([^']+)'", str(e))
    ):
        return unknown_option(found[1], found[2])
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and cause.full_key:
        return unknown_setting(cause.full_key, cause.object_type)
    # algoo=ppo: not a group or key
    if (unknown := re.match(r"Could not override '([^'.]+)'", str(e))) is not None:
        # Here, not at the top: the config's module imports every algorithm, which only this
        # message needs.
        from harness.config import Config

        return unknown_setting(unknown[1], Config)
    if isinstance(cause, OmegaConfBaseException):  # seed=abc: "Error merging override seed=abc"
        return f"{e}: {str(cause).splitlines()[0]}"
    if isinstance(e, MissingMandatoryValue):
        return f"{e.full_key} has no default: add {e.full_key}=<value> (--help says what it is)"
    if isinstance(e, OmegaConfBaseException):
        return str(e).splitlines()[0]  # the rest names the key and its type again
    return str(e)


def print_help(config_name: str, usage: str, argv: list[str]) -> None:
    """``--help``: the settings of the composition that the rest of the command line asks for."""
    overrides = [a for a in argv if not a.startswith("-")]
    with initialize_config_dir(version_base=None, config_dir=str(CONF)):
        cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    print(help_text(cfg, choices, usage))


def run(main: Callable[[], Any], config_name: str, usage: str) -> None:
    """Run a ``hydra.main`` function as the front door of a job's ranks: ``--help``
    and Hydra's printing flags from one rank; a mistake said once, exit status 2."""
    global _tracebacks
    argv = sys.argv[1:]
    _tracebacks = os.environ.get("HYDRA_FULL_ERROR") == "1"
    # Hydra raises what it finds in the command instead of printing it.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        if any(a in HELP_FLAGS for a in argv):
            if speaks():
                print_help(config_name, usage, argv)
            return
        if not speaks() and any(a in PRINTING_FLAGS for a in argv):
            return
        main()
    # Composing the config: an unknown key or option, a value of the wrong type.
    except HydraException as e:
        if _tracebacks:
            raise
        refuse(e)
    except ValueError as e:
        if not _tracebacks and NULL_GROUP in str(e):  # Hydra's defaults list, on group=null
            refuse(e)
        _crash()
    except Exception:
        _crash()


def _crash() -> NoReturn:
    """A failure, not a mistake: its traceback, then out at once. Python's own exit would free the
    process groups in its garbage collector, where gloo's destructor joins threads that wait on
    peers' pending sends: a collector whose env raised kept its trainer waiting dist_timeout_s for a
    batch never sent."""
    traceback.print_exc()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
