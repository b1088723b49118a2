"""The GPU check itself, on the Python that ``harness gpu-check`` chose (:mod:`.prepare`):
``python -m harness.cli.gpu_check.run [--out DIR] [--dry-run]``.

Runs every step (:mod:`.steps`), each bounded, prints one table, writes ``gpu_check.json``,
``gpu_check.md`` (both after every row) and ``logs.tar.gz`` (every step's output and the runs'
metrics) into ``--out``. A step that breaks is a row of the table; the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path

import torch

from harness.cli.gpu_check.steps import ROOT, STEPS, Check
from harness.cli.gpu_check.table import table, targets

SKIPPED = (
    "0 the GPU test tier, 1 the torchrun runs with a CUDA trainer, 2 sync=nccl, 3 the CUDA update "
    "benchmark, 4 the CUDA weight sync benchmark"
)


def machine(dry_run: bool) -> dict:
    return {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU (dry run)",
        "gpus": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
        "dry_run": dry_run,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness gpu-check")
    parser.add_argument(
        "--out", default=str(ROOT / "runs" / f"gpu_check-{time.strftime('%Y%m%d-%H%M%S')}")
    )
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device here (torch.cuda.is_available() is False). Skipped: "
            f"{SKIPPED}. harness gpu-check --dry-run runs every step on the CPU instead."
        )
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started, about = time.monotonic(), machine(args.dry_run)
    kind = "dry run on the CPU" if args.dry_run else "GPU check"
    command = "harness gpu-check" + (" --dry-run" if args.dry_run else "")

    def write(c: Check, final: bool = False) -> str:
        """The table and its JSON as they stand (after every row, and once at the end)."""
        total = time.monotonic() - started
        so_far = "in all" if final else "so far (still running)"
        header = f"{command}: {kind}, {about['date']}, {total:.0f} s {so_far}"
        text = table(c, about, header)
        (out / "gpu_check.md").write_text(text)
        figures = {"machine": about, "seconds": total, "final": final, "rows": c.rows}
        (out / "gpu_check.json").write_text(
            json.dumps({**figures, "targets": targets(c)}, indent=1)
        )
        return text

    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        c = Check(Path(tmp), args.dry_run)
        c.written = write
        for step in STEPS:
            try:
                step(c)
            except Exception as e:  # a broken step is a row of the table; the other steps still run
                (c.work / "logs" / f"{step.__name__}-error.log").write_text(traceback.format_exc())
                c.add("-", step.__name__, f"error ({type(e).__name__})", 0.0, str(e)[:300])
        print("\n" + write(c, final=True))
        with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
            tar.add(
                tmp,
                arcname="gpu_check",
                filter=lambda info: None if "/checkpoints" in info.name else info,
            )
    failed = [r for r in c.rows if r["status"] not in ("ok", "skipped")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
