"""The offline section of docs/results.md: a row per algorithm from its runs' ``metrics.csv``, and
the section that replaces its namesake in the file (``harness results offline``)."""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Callable
from pathlib import Path

from harness.data.format import Meta

# Gradient steps the table gives the normalised score at (where run).
SCORED_AT = (10_000, 50_000, 100_000)
TABLE_HEAD = (
    "| algorithm | dataset | gradient steps | seeds | final return | normalised "
    "| normalised at {at} | behaviour return | wall time | CORL |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
)


def replace_section(out: Path, section: str) -> None:
    """Put ``section`` (it starts with its ``## `` heading) into ``out`` in place of the section of
    the same heading; table rows of the old section whose first two cells no new row has (another
    algorithm's, or the same one's under another ``--label``) are kept. The rest of the file
    stays."""
    text = out.read_text() if out.exists() else "# Results\n"
    heading = section.strip().splitlines()[0]
    start = text.find("\n" + heading)
    if start < 0:
        out.write_text(text.rstrip("\n") + "\n" + section)
        return
    end = text.find("\n## ", start + 1)
    old, rest = text[start:end] if end >= 0 else text[start:], text[end:] if end >= 0 else ""

    def key(line: str) -> tuple[str, ...]:
        return tuple(cell.strip() for cell in line.strip("|").split("|")[:2])

    new_rows = [
        line
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith(("| algorithm", "| ---"))
    ]
    replaced = {key(r) for r in new_rows}
    kept = [
        line
        for line in old.splitlines()
        if line.startswith("| ")
        and not line.startswith(("| algorithm", "| ---"))
        and key(line) not in replaced
    ]
    if kept:
        section = section.replace(new_rows[0], "\n".join([*kept, new_rows[0]]), 1)
    out.write_text(text[:start] + section + rest)


def evaluations(rows: list[dict]) -> list[tuple[float, float]]:
    """``(gradient steps, eval/return)`` of a metrics.csv's rows that have an evaluation."""
    return [
        (float(r["gradient_steps"]), float(r["eval/return"]))
        for r in rows
        if r.get("eval/return") not in (None, "", "nan")
    ]


def final_sem(rows: list[dict]) -> float | None:
    """The standard error of a run's final return (the mean of its last three evaluations) from
    their ``eval/return_sem``: the root of their squares' sum over three (evaluations independent);
    None where the metrics have no SEM (runs from before it was logged) or one is nan."""
    evaluated = [r for r in rows if r.get("eval/return") not in (None, "", "nan")][-3:]
    sems = [float(r.get("eval/return_sem") or "nan") for r in evaluated]
    if not sems or any(math.isnan(s) for s in sems):
        return None
    return math.sqrt(sum(s * s for s in sems)) / len(sems)


def final_distance(rows: list[dict]) -> float | None:
    """How far the episodes of a run's last three evaluations moved forward, their mean
    (``eval/distance``: MuJoCo's locomotion); None where one of them has none."""
    evaluated = [r for r in rows if r.get("eval/return") not in (None, "", "nan")][-3:]
    distances = [float(r.get("eval/distance") or "nan") for r in evaluated]
    if not distances or any(math.isnan(d) for d in distances):
        return None
    return statistics.mean(distances)


def distance_cell(tables: list[list[dict]]) -> str:
    """``, forward x`` after the final return: the mean over seeds of :func:`final_distance`, so
    that a return earned standing still shows in the row; empty where a run has none."""
    distances = [final_distance(rows) for rows in tables]
    if any(d is None for d in distances):
        return ""
    return f", forward {statistics.mean(d for d in distances if d is not None):.1f}"


def normalised_at(
    rows: list[dict], steps: int, normalized: Callable[[float], float | None]
) -> float:
    """The normalised score of the newest evaluation at or before ``steps`` gradient steps; nan if
    the run had not got that far."""
    if float(rows[-1]["gradient_steps"]) < steps:
        return math.nan
    returns = [e for at, e in evaluations(rows) if at <= steps]
    score = normalized(returns[-1]) if returns else None
    return math.nan if score is None else score


def score(normalised: float | None) -> str:
    """A normalised score as the table shows it; - for none."""
    return "-" if normalised is None else f"{normalised:.1f}"


def offline_row(
    name: str,
    dataset_name: str,
    run_dirs: list[Path],
    meta: Meta,
    scored_at: tuple[int, ...],
    published: str = "-",
) -> str:
    """One table row from finished run directories: the final return (the mean of each seed's last
    three evaluations), its normalised score, the normalised scores at ``scored_at`` steps, the
    behaviour return (and its normalised score), the wall time (``time_s`` of each run's last row,
    mean over seeds) and the ``published`` score beside it."""
    tables = [list(csv.DictReader((d / "metrics.csv").open())) for d in run_dirs]
    finals = [statistics.mean([e for _, e in evaluations(rows)][-3:]) for rows in tables]
    mean = statistics.mean(finals)
    spread = f" ± {statistics.stdev(finals):.1f}" if len(finals) > 1 else ""
    return_sem, score_sem = sem_cells(tables, meta)
    at = []
    for steps in scored_at:
        scores = [
            s
            for s in (normalised_at(rows, steps, meta.normalized) for rows in tables)
            if not math.isnan(s)
        ]
        at.append(score(statistics.mean(scores) if scores else None))
    steps_run = int(float(tables[0][-1]["gradient_steps"]))
    verdict = "above" if mean > meta.behaviour_return else "NOT above"
    normalised_behaviour = meta.normalized(meta.behaviour_return)
    behaviour_score = "" if normalised_behaviour is None else f", {normalised_behaviour:.1f}"
    wall = statistics.mean(float(rows[-1]["time_s"]) for rows in tables)
    cells = [
        name,
        dataset_name,
        f"{steps_run:,}",
        str(len(finals)),
        f"{mean:.1f}{spread}{return_sem}{distance_cell(tables)}",
        score(meta.normalized(mean)) + (score_sem if meta.normalized(mean) is not None else ""),
        " / ".join(at),
        f"{meta.behaviour_return:.1f}{behaviour_score} ({verdict})",
        f"{wall:.0f} s",
        published,
    ]
    return "| " + " | ".join(cells) + " |"


def sem_cells(tables: list[list[dict]], meta: Meta) -> tuple[str, str]:
    """`` (SEM x)`` beside the final return and the normalised score: the standard error of the
    mean over seeds of each seed's final return, from the evaluations' ``eval/return_sem``; empty
    where a run's metrics have none."""
    sems = [final_sem(rows) for rows in tables]
    if any(s is None for s in sems):
        return "", ""
    sem = math.sqrt(sum(s * s for s in sems if s is not None)) / len(sems)
    low, high = meta.normalized(0.0), meta.normalized(1.0)
    factor = abs(high - low) if low is not None and high is not None else math.nan
    return f" (SEM {sem:.1f})", f" (SEM {sem * factor:.1f})"


def section(
    title: str, made_by: str, dataset: str, meta: Meta, episodes: int, scored_at: list[int]
) -> str:
    """The section's heading, how its rows were made and read, and its table's head; the rows
    follow it."""
    at = " / ".join(f"{s // 1000}k" for s in scored_at)
    return (
        f"\n## {title}\n\n{made_by}\n"
        f"Dataset `{dataset}`: {described(meta)}\n"
        "Final return: per seed, the mean `eval/return` of the last three evaluations "
        f"({episodes} deterministic episodes each), ± the standard deviation over seeds, and "
        "(SEM x) the evaluation episodes' standard error of that mean (from `eval/return_sem`; "
        "none for runs logged before it), and where logged how far those episodes moved forward "
        "(`eval/distance`, mean over seeds: a return earned standing still shows as about 0); "
        "normalised: "
        "`100 * (R - random) / (expert - random)`; at N steps: the newest evaluation by then, mean "
        "over seeds (- where no run got there); the behaviour return, and its normalised score. "
        "Wall time: `time_s` of a run's last row, mean over seeds. CORL: the published score "
        "beside it.\n\n" + TABLE_HEAD.format(at=at)
    )


def described(meta: Meta) -> str:
    """What the dataset is: its size, where its behaviour came from, its returns and digest."""
    expert = f"{meta.expert_return:.1f}" if meta.expert_return is not None else "none"
    returns = (
        f"behaviour return {meta.behaviour_return:.1f} over {meta.episodes:,} episodes, random "
        f"{meta.random_return:.1f}, expert {expert}"
    )
    digest = f"; digest `{meta.digest[:16]}`" if meta.digest else ""
    if meta.recipe is None:
        behaviour = meta.sources[0]  # the policy and checkpoint it was written with
        return (
            f"{meta.transitions:,} transitions of a {behaviour['algo'].upper()} policy stopped at "
            f"{behaviour['frames']:,} frames; {returns} (the fully trained policy, "
            f"deterministic){digest}."
        )
    chosen = (meta.checkpoints or {}).get("behaviour", {})
    return (
        f"{meta.transitions:,} transitions, `{meta.recipe['kind']}` by the recipe "
        f"`{meta.recipe['name']}` seed {meta.recipe['seed']} ({meta.recipe['preset']}, behaviour "
        f"checkpoint at {chosen.get('frames', 0):,} frames); {returns} (the recipe's "
        f"references){digest}."
    )
