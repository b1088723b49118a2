"""Evaluation videos: MP4 files written with PyAV (FFmpeg's libraries, in
its wheel), read back for TensorBoard, which shows videos as animated GIFs.

Rendering needs no display. Classic-control envs draw with pygame into an
off-screen surface (SDL's ``dummy`` video driver); MuJoCo envs draw with
OpenGL through EGL (``MUJOCO_GL=egl``): Mesa's software renderer on a machine
without a GPU (Debian: ``libegl1 libegl-mesa0 libgl1-mesa-dri``), the NVIDIA
driver's EGL on a GPU node. :func:`headless_rendering` picks both unless the
environment already chose, or a display is there to use.
"""

from __future__ import annotations

import importlib.util
import io
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

VIDEO_HINT = "pip install -e '.[video]'  (or: EXTRAS=video scripts/train.sh ...)"


def check_video_support() -> None:
    """Fail at start-up, with what to do, where videos cannot be written:
    PyAV writes them, pygame draws classic-control envs (both in the extra).
    Probed without importing them (pygame greets whoever imports it)."""
    missing = [
        name
        for module, name in (("av", "PyAV"), ("pygame", "pygame"))
        if importlib.util.find_spec(module) is None
    ]
    if missing:
        raise ValueError(
            f"videos need PyAV and pygame; {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed. Install the extra: {VIDEO_HINT}"
        )


def headless_rendering() -> None:
    """Render without a display: EGL for MuJoCo, SDL's dummy driver for pygame."""
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("MUJOCO_GL", "egl")
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")


def _even(frame: np.ndarray) -> np.ndarray:
    """H.264 in yuv420p needs even sides: drop a last odd row or column."""
    return frame[: frame.shape[0] // 2 * 2, : frame.shape[1] // 2 * 2]


def write_mp4(path: Path, frames: Sequence[np.ndarray], fps: float) -> Path:
    """``frames`` (H x W x 3, uint8) as an H.264 MP4 at ``path``, written
    under a temporary name first so that a reader never sees half a file."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    with av.open(str(partial), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=max(round(fps), 1))
        first = _even(frames[0])
        stream.height, stream.width = first.shape[:2]
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            for packet in stream.encode(
                av.VideoFrame.from_ndarray(np.ascontiguousarray(_even(frame)), format="rgb24")
            ):
                container.mux(packet)
        for packet in stream.encode():  # flush the encoder's delayed frames
            container.mux(packet)
    os.replace(partial, path)
    return path


def read_frames(path: Path) -> np.ndarray:
    """Every frame of a video file, ``(T, H, W, 3)`` uint8."""
    import av

    with av.open(str(path)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])


def fps_of(path: Path) -> float:
    import av

    with av.open(str(path)) as container:
        rate = container.streams.video[0].average_rate
        return float(rate) if rate else 30.0


def gif_bytes(frames: np.ndarray, fps: float, width: int = 320) -> tuple[bytes, int, int]:
    """``frames`` as an animated GIF, scaled down to ``width`` pixels (TensorBoard's
    video format); returns the GIF and its height and width."""
    from PIL import Image

    images = [Image.fromarray(f) for f in frames]
    scale = min(1.0, width / images[0].width)
    size = (max(int(images[0].width * scale), 1), max(int(images[0].height * scale), 1))
    images = [im.resize(size) for im in images]
    out = io.BytesIO()
    images[0].save(
        out, format="GIF", save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0
    )
    return out.getvalue(), size[1], size[0]
