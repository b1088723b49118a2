"""Weights & Biases: one run per job, written by trainer 0 only.

The run is named after the run directory, grouped by the experiment preset (``logger.group``; a
sweep's runs of one preset share it), and tagged with the algorithm, the env and the weight sync
scheme. The run id is kept in ``<run_dir>/wandb_id`` so that a resumed job continues the same wandb
run. wandb is a window on the run, never a reason to stop it: if it fails (no network, a bad key, a
full disk), the failure is reported once and training goes on with the CSV log. Keys are never
printed or saved."""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

log = logging.getLogger("harness")


def _scrub(text: str) -> str:
    key = os.environ.get("WANDB_API_KEY")
    return text.replace(key, "***") if key else text


def tags(config: dict, extra: list[str]) -> list[str]:
    """The algorithm, env and sync scheme of ``config`` (as config.yaml holds it), then
    ``extra``."""
    known = [
        config.get("algo", {}).get("name"),
        config.get("env", {}).get("id"),
        config.get("sync", {}).get("name"),
    ]
    found = [str(t) for t in known if t] + [t for t in extra if t not in known]
    return [t[:64] for t in found]  # wandb refuses longer tags


class WandbSink:
    """One wandb run; any failure is reported once and turns the sink off."""

    def __init__(self, run_dir: Path, config: dict, cfg, step: str = "frames"):
        self.run, self.mode, self.step = None, cfg.mode, step
        id_file = run_dir / "wandb_id"
        try:
            import wandb

            run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(6)
            self.run = wandb.init(
                project=cfg.project,
                entity=cfg.entity,
                group=cfg.group,
                name=cfg.name or run_dir.name,
                tags=tags(config, list(cfg.tags)),
                config=config,
                dir=str(run_dir),
                id=run_id,
                resume="allow",
                mode=cfg.mode,
                # Offline, quiet: wandb's own footer would print the `wandb sync` command beside
                # ours (close).
                settings=wandb.Settings(
                    console="off", init_timeout=cfg.init_timeout_s, quiet=cfg.mode == "offline"
                ),
            )
            id_file.write_text(run_id)
            # Charts against env frames (offline: gradient steps), so a resumed run's rows land
            # where they belong.
            self.run.define_metric(step)
            self.run.define_metric("*", step_metric=step)
        except Exception as e:  # wandb must never stop training
            self._fail("could not start", e)

    def _fail(self, what: str, e: Exception) -> None:
        log.warning(
            "wandb %s (%s: %s); training goes on, logging to metrics.csv only",
            what,
            type(e).__name__,
            _scrub(str(e)),
        )
        self.run = None

    def write(self, row: dict[str, float]) -> None:
        if self.run is None:
            return
        try:
            self.run.log(row)
        except Exception as e:
            self._fail("failed to log", e)

    def write_video(self, path: Path, step: int, key: str = "eval/video") -> None:
        if self.run is None:
            return
        try:
            import wandb

            self.run.log({key: wandb.Video(str(path), format="mp4"), self.step: step})
        except Exception as e:  # a video is not worth the metrics: warn, keep logging
            log.warning(
                "wandb could not log the video %s (%s: %s)", path, type(e).__name__, _scrub(str(e))
            )

    def close(self) -> None:
        if self.run is None:
            return
        path = Path(self.run.dir).parent  # .../wandb/offline-run-<time>-<id>
        try:
            self.run.finish()
        except Exception as e:
            self._fail("failed to finish", e)
            return
        if self.mode == "offline":
            print(
                f"wandb: this run was logged offline; upload it with: wandb sync {path}", flush=True
            )
