"""The ranges of algorithms' numeric fields, declared on the fields themselves.

``gamma: float = ranged(0.99, UNIT)`` says, where the field is declared, what
values it takes; :func:`check_ranges` (every config's ``__post_init__``, through
``AlgoConfig``) reads them all. A field declared without one takes any value
of its type.
"""

from __future__ import annotations

from dataclasses import field, fields
from typing import Any

# (low, high, low included, high included)
Range = tuple[float, float, bool, bool]
INF = float("inf")
UNIT: Range = (0.0, 1.0, False, True)  # (0, 1]
OPEN_UNIT: Range = (0.0, 1.0, False, False)  # (0, 1)
PROBABILITY: Range = (0.0, 1.0, True, True)  # [0, 1]
POSITIVE: Range = (0.0, INF, False, False)
NON_NEGATIVE: Range = (0.0, INF, True, False)
AT_LEAST_ONE: Range = (1.0, INF, True, False)


def ranged(default: Any, bounds: Range) -> Any:
    """A dataclass field with ``default`` whose value must lie in ``bounds``."""
    return field(default=default, metadata={"range": bounds})


def describe_range(low: float, high: float, low_in: bool, high_in: bool) -> str:
    if high == INF:
        return f">= {low:g}" if low_in else f"> {low:g}"
    return f"in {'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"


def check_ranges(cfg: Any, prefix: str, owner: str) -> None:
    """Refuse the first field of dataclass ``cfg`` outside its declared range, naming it as
    ``prefix.<field>``."""
    for f in fields(cfg):
        value, bounds = getattr(cfg, f.name), f.metadata.get("range")
        if bounds is None or value is None or isinstance(value, bool):
            continue
        low, high, low_in, high_in = bounds
        if not (
            (low <= value if low_in else low < value)
            and (value <= high if high_in else value < high)
        ):
            raise ValueError(
                f"{prefix}.{f.name}={value:g} is out of range: {owner} needs it "
                f"{describe_range(*bounds)}"
            )
