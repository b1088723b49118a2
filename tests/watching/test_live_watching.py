"""Watching a run live (docs/watching.md): the console progress on a terminal
and in a log, Ctrl-C under a real terminal, TensorBoard, evaluation videos,
and ``python -m harness.cli.evaluate``."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from helpers import ONE_THREAD, column, launch_env, rows, run_harness, wait_for
from terminal import Terminal

from harness.core import checkpoint
from harness.distributed import signals
from harness.metrics.console import ProgressBar, ProgressLines, clock, make_console

TINY = ["debug=tiny"]  # 1024 frames, a row every 256
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colours, erase-line, cursor show/hide
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # any control character but tab and newline
LAUNCH = [
    sys.executable,
    "-m",
    "harness.cli.launch",
    "--standalone",
    "--nproc_per_node=3",
    "--max-restarts=0",
    "-m",
    "harness.train",
]


@contextmanager
def terminal(argv: list[str], cwd: Path) -> Iterator[Terminal]:
    """``argv`` on a pseudo-terminal; a test that fails midway stops it at once (Ctrl-C twice)."""
    term = Terminal(argv, cwd)
    try:
        yield term
    finally:
        if not term.exited():
            term.ctrl_c()
            term.ctrl_c()
            term.wait(60)


def csv_rows(run_dir: Path) -> list[dict[str, str]]:
    """``metrics.csv``'s rows so far; none before it exists."""
    return rows(run_dir) if (run_dir / "metrics.csv").exists() else []


def last_frames(run_dir: Path) -> int:
    table = csv_rows(run_dir)
    return int(table[-1]["frames"]) if table and table[-1].get("frames") else 0


def checkpoints(run_dir: Path) -> list[Path]:
    return sorted(checkpoint.checkpoint_dir(run_dir).glob("step-*"))


class Run(NamedTuple):
    run_dir: Path
    out: subprocess.CompletedProcess


@pytest.fixture(scope="module")
def evaluated_run(tmp_path_factory) -> Run:
    """One tiny run in one process, its output piped (no terminal), shared by the tests below that
    only read it: it evaluates one episode every 256 frames (the weights of 256, 512 and 768 frames
    on the collector; the final ones in the trainer: the last row's eval/final_return), records the
    1st and 3rd evaluations (eval.video_every=2), writes TensorBoard too and keeps a checkpoint of
    every 256 frames."""
    where = tmp_path_factory.mktemp("evaluated")
    out = run_harness(
        [
            *TINY,
            "logger.backends=[csv,tensorboard]",
            "eval.every_frames=256",
            "eval.episodes=1",
            "eval.video_every=2",
            "checkpoint.every_frames=256",
            "checkpoint.keep=4",
            "run_dir=run",
        ],
        where,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return Run(where / "run", out)


def evaluation_returns(run_dir: Path) -> list[float]:
    returns = column(
        rows(run_dir), "eval/return"
    )  # eval.every_frames = log_every_frames: one evaluation a row
    assert len(returns) == 3
    return returns


# -- the console ---------------------------------------------------------------------------------

BAR = re.compile(
    r"frames [━╸╺ ]+ (?P<done>[\d,]+)/(?P<total>[\d,]+) (?P<rate>[\d,]+|-)/s "
    r"(?P<eta>\d+:\d\d:\d\d|-:--:--)\s*(?P<figures>.*)"
)
LINE = re.compile(
    r"frames +(?P<done>[\d,]+)/1,024 \( *(?P<percent>[\d.]+)%\) \| +(?P<rate>[\d,]+) frames/s \| "
    r"eta (?P<eta>\d\d:\d\d:\d\d) \| return (?P<ret>-?[\d.]+)(?: \| eval (?P<eval>-?[\d.]+))? \| "
    r"lag (?P<lag>[\d.]+)"
)


@pytest.mark.e2e
def test_progress_bar_is_redrawn_in_place_on_a_terminal(workdir):
    with terminal(
        [sys.executable, "-m", "harness.train", *TINY, *ONE_THREAD, "run_dir=run"], workdir
    ) as term:
        assert term.wait(120) == 0, term.text[-3000:]
    text, table = term.text, rows(workdir / "run")
    assert (
        "\r\x1b[2K" in text
    )  # the bar's line is erased and drawn again, not followed by new lines
    pieces = [ANSI.sub("", p).strip() for p in re.split(r"[\r\n]+", text)]
    draws = [BAR.fullmatch(p) for p in pieces if p.startswith("frames ")]
    assert len(draws) >= 2 and all(draws), pieces
    done = [int(d["done"].replace(",", "")) for d in draws]
    assert done == sorted(done) and done[-1] == 1024 and {d["total"] for d in draws} == {"1,024"}
    final = draws[-1]
    assert final["rate"] != "-" and final["eta"] == "0:00:00"
    assert final["figures"] == f"return {float(table[-1]['train/episode_return']):.1f} | lag 0.00"
    # trainer 0's log lines go above the bar, whole, not through it
    saved = f"checkpoint: {(workdir / 'run/checkpoints/step-000000001024').resolve()} ("
    assert any(p.startswith(saved) and p.endswith(" s)") for p in pieces), pieces
    assert not any(LINE.fullmatch(p) for p in pieces)  # no plain progress lines on a terminal


@pytest.mark.e2e
def test_progress_is_one_plain_line_per_row_without_a_terminal(evaluated_run):
    out, table = evaluated_run.out, rows(evaluated_run.run_dir)
    assert not CONTROL.search(out.stdout + out.stderr), repr((out.stdout + out.stderr)[-2000:])
    lines = [LINE.fullmatch(line) for line in out.stdout.splitlines() if line.startswith("frames ")]
    assert len(lines) == len(table) == 4 and all(lines), out.stdout
    # an evaluation's return stays on the line until the next one; the final weights' is the last
    shown = None
    for line, row in zip(lines, table):
        assert int(line["done"].replace(",", "")) == int(row["frames"])
        assert float(line["percent"]) == pytest.approx(100 * int(row["frames"]) / 1024, abs=0.05)
        assert line["ret"] == f"{float(row['train/episode_return']):.1f}"
        for key in ("eval/return", "eval/final_return"):
            shown = f"{float(row[key]):.1f}" if row.get(key) else shown
        assert line["eval"] == shown
    assert shown == f"{float(table[-1]['eval/final_return']):.1f}"


@pytest.mark.unit
def test_plain_lines_rates_and_times_left_past_a_day():
    out = io.StringIO()
    lines = make_console(100_000_000, stream=out)  # not a terminal: lines
    assert isinstance(lines, ProgressLines)
    lines.write({"frames": 1000, "time_s": 1.0, "train/episode_return": 20.0})
    lines.write({"frames": 3000, "time_s": 2.0, "train/episode_return": 22.0, "eval/return": 500.0})
    lines.write({"frames": 5000, "time_s": 3.0, "train/episode_return": float("nan")})
    first, second, third = out.getvalue().splitlines()
    assert "1,000 frames/s" in first and "eta 27:46:39" in first  # 99,999,000 frames at 1,000/s
    assert "2,000 frames/s" in second and second.endswith("| return 22.0 | eval 500.0")
    assert third.endswith("| return 22.0 | eval 500.0")  # the figures stay until new ones come
    assert (
        clock(float("inf")) == "--:--:--"
        and clock(59.9) == "00:00:59"
        and clock(360_000) == "100:00:00"
    )


@pytest.mark.unit
def test_bar_only_on_a_terminal_and_lines_printed_meanwhile_stay_whole(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("TERM", "dumb")
    assert isinstance(make_console(10, stream=Tty()), ProgressLines)
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "40")
    screen, stdout = Tty(), sys.stdout
    bar = make_console(10, stream=screen)
    said = (
        "Resume: the same command with run_dir=" + "/long/path" * 10
    )  # 138 characters on 40 columns
    try:
        assert isinstance(bar, ProgressBar)
        print(
            said
        )  # goes above the bar, in one piece: the terminal folds it, the text keeps it whole
        bar.tick(5)
    finally:
        bar.close()
    assert said in screen.getvalue() and sys.stdout is stdout  # and print goes where it went before


# -- Ctrl-C --------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_ctrl_c_checkpoints_says_how_to_resume_and_the_same_command_resumes(workdir):
    """The launch of scripts/train.sh (harness.cli.launch, 1 trainer + 2 collectors) on a
    terminal."""
    run_dir = workdir / "run"
    command = [
        *LAUNCH,
        *TINY,
        "collector.total_frames=100000000",
        "checkpoint.every_frames=0",
        "run_dir=run",
    ]

    with terminal(command, workdir) as first:
        wait_for(lambda: last_frames(run_dir) > 0 or first.exited(), 180, "the first metrics row")
        before = last_frames(run_dir)
        assert before and not checkpoints(run_dir), first.text[
            -3000:
        ]  # training, no checkpoint yet
        first.ctrl_c()
        assert first.wait(90) == 130, first.text[-3000:]  # the shell's "ended by Ctrl-C"
    text = first.text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert text.count(signals.ACK.strip()) == 1
    said = re.findall(
        r"interrupted \(Ctrl-C\) at frames (\d+): checkpoint written\. Resume: the same command "
        r"with run_dir=(\S+)",
        text,
    )
    assert len(said) == 1 and text.count("Resume:") == 1, text[-3000:]
    step, where = int(said[0][0]), said[0][1]
    assert where == str(run_dir.resolve())
    saved = checkpoint.checkpoint_dir(run_dir) / f"step-{step:012d}"
    assert (
        checkpoints(run_dir) == [saved] and checkpoint.intact(saved) and step >= before
    )  # written after the Ctrl-C
    assert last_frames(run_dir) == step  # the stop's own row
    # The run's last words: how far it got, and the command that resumes it (after the bar, in plain
    # text).
    assert re.search(
        rf"run stopped \(interrupted \(Ctrl-C\)\): frames {step:,} of 100,000,000, trained for ",
        text,
    ), text[-3000:]
    assert (
        f"  resume:   the same command with run_dir={where}" in text
        and text.count("run stopped") == 1
    ), text[-3000:]

    with terminal(command, workdir) as second:
        wait_for(
            lambda: last_frames(run_dir) > step or second.exited(),
            180,
            "a row after the resumed checkpoint",
        )
        second.ctrl_c()
        assert second.wait(90) == 130, second.text[-3000:]
    text = second.text
    assert f"resumed from {saved.resolve()}: frames {step}," in text, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert text.count("Resume: the same command") == 1
    frames = [int(r["frames"]) for r in rows(run_dir)]
    assert frames == sorted(set(frames)) and frames[-1] > step  # every frame range once
    assert (
        len(checkpoints(run_dir)) == 2
        and checkpoints(run_dir)[-1].name == f"step-{frames[-1]:012d}"
    )


# -- TensorBoard ---------------------------------------------------------------------------------


def tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """What TensorBoard shows: every scalar tag's (step, value) in order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def csv_as_tensorboard(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """metrics.csv as TensorBoard holds it: 32-bit floats, the step column as steps, no nan or empty
    cells."""
    expected: dict[str, list[tuple[int, float]]] = {}
    for row in rows(run_dir):
        for key, value in row.items():
            if key != "frames" and value not in ("", "nan"):
                expected.setdefault(key, []).append(
                    (int(row["frames"]), float(np.float32(float(value))))
                )
    return expected


@pytest.mark.e2e
def test_tensorboard_holds_the_csv_values_also_after_a_resume(workdir):
    run_dir = workdir / "run"
    command = [
        *TINY,
        "logger.console=false",
        "logger.backends=[csv,tensorboard]",
        "checkpoint.every_frames=512",
        "run_dir=run",
    ]
    out = run_harness(command, workdir)
    assert out.returncode == 0, out.stderr[-3000:]
    scalars = tensorboard_scalars(run_dir)
    assert scalars == csv_as_tensorboard(run_dir)
    assert [s for s, _ in scalars["train/episode_return"]] == [256, 512, 768, 1024]
    assert {"time_s", "train/policy_loss", "collect/frames_per_s", "sync/version"} <= set(scalars)

    # As if the job had died after logging rows 768 and 1024 but before its final checkpoint: the
    # resumed run logs them again, and TensorBoard, like metrics.csv, drops the first run's.
    first_run = scalars["train/episode_return"]
    shutil.rmtree(run_dir / "checkpoints/step-000000001024")
    again = run_harness(command, workdir)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stdout + again.stderr
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 2
    scalars = tensorboard_scalars(run_dir)
    assert scalars == csv_as_tensorboard(run_dir)
    assert [s for s, _ in scalars["train/episode_return"]] == [256, 512, 768, 1024]
    assert scalars["train/episode_return"][:2] == first_run[:2]


# -- evaluation videos, python -m harness.cli.evaluate -------------------------------------------


def decoded(path: Path) -> list[np.ndarray]:
    import av

    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


@pytest.mark.e2e
def test_evaluation_videos_hold_one_frame_per_step_of_the_episode(evaluated_run):
    """One episode per evaluation: on CartPole (reward 1 per step) its return is its
    length, and its video holds one frame per step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = evaluated_run.run_dir
    returns = evaluation_returns(run_dir)
    videos = sorted((run_dir / "videos").glob("eval-*"))
    assert [v.name[:18] for v in videos] == ["eval-000000000256-", "eval-000000000768-"] and all(
        v.suffix == ".mp4" for v in videos
    )
    for path, expected in zip(videos, (returns[0], returns[2])):  # the 1st and the 3rd evaluation
        frames = decoded(path)
        assert len(frames) == int(expected) == expected, path.name
        assert frames[0].shape == (400, 600, 3)  # CartPole's 600 x 400 picture
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    assert len(events.Images("eval/video")) == 2  # each video, as an animated GIF


@pytest.mark.unit
def test_videos_without_the_extra_fail_at_start_up_saying_what_to_install(monkeypatch):
    import importlib.util

    from harness.config import EvalConfig
    from harness.metrics import video

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pygame" else find_spec(name, *a),
    )
    with pytest.raises(
        ValueError,
        match=r"pygame is not installed\. Install the extra: pip install -e '\.\[video\]'",
    ):
        EvalConfig(every_frames=256, video_every=1)
    assert EvalConfig(every_frames=256).video_every == 0  # no videos asked for: nothing needed
    monkeypatch.undo()
    video.check_video_support()  # here the extra is installed


def evaluate(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli.evaluate", *args],
        cwd=cwd,
        env=launch_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def printed_mean(out: subprocess.CompletedProcess) -> str:
    found = re.findall(
        r": return (-?[\d.]+) ± [\d.]+ over (\d+) deterministic episodes", out.stdout
    )
    assert len(found) == 1, out.stdout + out.stderr
    return found[0][0]


@pytest.mark.e2e
def test_evaluate_replays_the_runs_evaluations(evaluated_run, workdir):
    """The collector's last evaluation played the weights of 768 frames, and the trainer the
    final weights of 1,024, both checkpointed: harness.cli.evaluate, with the run's seed and
    episode count, plays the same episodes with them."""
    run_dir = evaluated_run.run_dir
    returns, last = evaluation_returns(run_dir), rows(run_dir)[-1]
    final = evaluate([str(run_dir)], workdir)  # the newest checkpoint: the final weights
    assert final.returncode == 0, final.stderr[-3000:]
    assert (
        printed_mean(final) == f"{float(last['eval/final_return']):.2f}"
        and "step-000000001024" in final.stdout
    )
    scored = evaluate([str(run_dir), "step=768", "video=true"], workdir)
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert printed_mean(scored) == f"{returns[2]:.2f}" and "step-000000000768" in scored.stdout
    path = run_dir / "videos" / "evaluate-step-000000000768.mp4"
    assert f"video: {path} ({int(returns[2])} frames)" in scored.stdout
    ours, theirs = (
        decoded(path),
        decoded(next((run_dir / "videos").glob("eval-000000000768-*.mp4"))),
    )
    assert len(ours) == len(theirs) and all(
        np.array_equal(a, b) for a, b in zip(ours, theirs)
    )  # the same episode


@pytest.mark.unit
def test_evaluate_refuses_mistakes_with_a_sentence(tmp_path):
    from harness.cli import evaluate as evaluate_module

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints/step-000000000512").mkdir(parents=True)
    (run_dir / "checkpoints/step-000000000512/state.pt").write_bytes(b"")
    (run_dir / "config.yaml").write_text("env: {id: CartPole-v1}\nseed: 1\neval: {episodes: 2}\n")
    (tmp_path / "started").mkdir()
    (tmp_path / "started/config.yaml").write_text((run_dir / "config.yaml").read_text())
    for args, says in (
        ([str(run_dir), "episodes=abc"], "episodes=abc is not a whole number"),
        ([str(run_dir), "episodes=0"], "episodes must be at least 1"),
        ([str(run_dir), "step=1.5"], "step=1.5 is not a whole number"),
        ([str(run_dir), "video=maybe"], "video=maybe is not true or false"),
        ([str(run_dir), "epsiodes=3"], "epsiodes= is not an option of harness evaluate"),
        ([str(run_dir), "step=100"], "has no checkpoint at step 100; it has: [512]"),
        ([str(tmp_path)], "is not a run directory (no config.yaml)"),
        ([str(tmp_path / "started")], "started has no checkpoint yet"),
        ([], "usage: harness evaluate RUN_DIR"),
    ):
        with pytest.raises(SystemExit) as stopped:
            evaluate_module.main(args)
        assert isinstance(stopped.value.code, str) and says in stopped.value.code, (
            args,
            stopped.value.code,
        )  # the command's status: 2 for a mistake (UsageError), 1 for a run without checkpoints


@pytest.mark.e2e
def test_evaluate_scores_the_final_checkpoint_as_the_run_logged_it(workdir):
    """An offline run's last row waits for the final weights' evaluation, so
    ``python -m harness.cli.evaluate RUN_DIR`` (the newest checkpoint: the final one)
    prints the last eval/return in metrics.csv."""
    dataset = subprocess.run(
        [sys.executable, "-m", "harness.cli.dataset", "env=cartpole", "out=rand", "frames=500"],
        cwd=workdir,
        env=launch_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dataset.returncode == 0, dataset.stderr[-3000:]
    out = run_harness(
        [
            "algo=cql",
            "env=cartpole",
            "dataset=rand",
            "algo.hidden=32",
            "algo.compile=false",
            "algo.gradient_steps=100",
            "sync.publish_every_updates=50",
            "logger.log_every_frames=50",
            "eval.episodes=3",
            "logger.console=false",
            "run_dir=run",
        ],
        workdir,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    last = rows(workdir / "run")[-1]
    assert (
        int(last["gradient_steps"]) == 100 and int(float(last["eval/version"])) == 2
    )  # the final weights',
    assert float(last["eval/episodes"]) == 3  # and theirs only
    assert [p.name for p in checkpoints(workdir / "run")] == ["step-000000000100"]
    scored = evaluate(["run"], workdir)
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert (
        printed_mean(scored) == f"{float(last['eval/return']):.2f}"
        and "step-000000000100" in scored.stdout
    )
