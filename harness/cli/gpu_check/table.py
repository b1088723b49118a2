"""The GPU check's table: its rows, and the issue's targets read off them (docs/gpu.md)."""

from __future__ import annotations

from harness.cli.gpu_check.steps import Check


def targets(c: Check) -> list[str]:
    """The issue's targets, read from the rows (docs/gpu.md)."""
    found = []
    sac = next((r for r in c.rows if r["check"] == "update sac"), {})
    if sac.get("cpu_ms") and sac.get("device_ms"):
        speedup = sac["cpu_ms"] / sac["device_ms"]
        found.append(f"SAC update, cpu/{c.device}: {speedup:.1f}x (target >= 5x)")
    for r in c.rows:
        if r["check"].startswith("update ") and r.get("compiled_ms"):
            speedup = r["device_ms"] / r["compiled_ms"]
            found.append(
                f"{r['check'][7:]} compiled vs eager on {c.device}: {speedup:.2f}x (target >= 1.5x)"
            )
    sync = next((r for r in c.rows if r["check"].startswith("weight sync")), {})
    medians = sync.get("medians_ms", {})
    for scheme in ("shm", "gloo", "hierarchical"):
        if scheme in medians and "d2h" in medians:
            ratio = medians[scheme] / medians["d2h"]
            found.append(
                f"publish by {scheme} / plain device-to-host copy: {ratio:.2f}x (target <= 2x)"
            )
    return found


def table(c: Check, machine: dict, header: str) -> str:
    """The markdown table of every row so far, the targets below it."""
    lines = [
        header,
        "",
        f"Machine: {machine['gpu']}; torch {machine['torch']} (CUDA {machine['cuda']}); "
        f"{machine['cpus']} CPUs.",
        "",
        "| step | check | status | s | result |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['step']} | {r['check']} | {r['status']} | {r['seconds']:.0f} | {r['result']} |"
        for r in c.rows
    ]
    found = targets(c)
    if found:
        lines += ["", "Targets:", "", *[f"- {t}" for t in found]]
    return "\n".join(lines) + "\n"
