"""TensorBoard: event files in ``<run_dir>/tensorboard/``, written by trainer 0.

Every metrics row becomes scalars at its step (env frames; offline: gradient
steps), the same values as ``metrics.csv`` (TensorBoard keeps them as 32-bit
floats; a ``nan``, a quantity with nothing to average over yet, is left out).
A resumed run starts a new event file that tells TensorBoard to drop what
earlier files hold past the checkpoint, as ``metrics.csv`` drops those rows.
Videos appear under the Images tab, as animated GIFs. The run's config is a
table under the Text tab (``hyperparameters``, as CleanRL writes it), from
``config.yaml``: interpolations unresolved, so an ``${oc.env:...}`` secret
shows as written, never as its value.

    tensorboard --logdir runs/           # every run under runs/, side by side
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from harness.metrics import video
from harness.metrics.flat import flat

log = logging.getLogger("harness")


def config_table(config: dict) -> str:
    """A Markdown table of every setting, one row each, sorted by key."""
    rows = ["|setting|value|", "|-|-|"]
    for key, value in sorted(flat(config).items()):
        cell = str(value).replace("|", "\\|")  # a | inside a value would end its cell
        rows.append(f"|{key}|{cell}|")
    return "\n".join(rows)


class TensorBoardSink:
    """Scalars and videos for one run directory."""

    def __init__(
        self, run_dir: Path, step: str = "frames", resume_step: int = 0, config: dict | None = None
    ):
        from torch.utils.tensorboard import SummaryWriter

        self.step = step
        self.writer = SummaryWriter(
            str(run_dir / "tensorboard"), purge_step=resume_step + 1 if resume_step else None
        )
        # at the step it applies from: a resumed run may have changed its budget or logging
        if config:
            self.writer.add_text("hyperparameters", config_table(config), resume_step)
            self.writer.flush()

    def write(self, row: dict[str, float]) -> None:
        step = int(row[self.step])
        for key, value in row.items():
            if key != self.step and not math.isnan(value):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def write_video(self, path: Path, step: int, key: str = "eval/video") -> None:
        from torch.utils.tensorboard.summary import Summary

        gif, height, width = video.gif_bytes(video.read_frames(path), video.fps_of(path))
        image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=gif)
        self.writer._get_file_writer().add_summary(
            Summary(value=[Summary.Value(tag=key, image=image)]), step
        )
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
