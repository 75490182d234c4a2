"""Throughput charts drawn by the server as plain numbers for an inline SVG: one bar per minute
of the last hour. No script draws them and nothing is fetched to show them."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence

MINUTES = 60


@dataclasses.dataclass(frozen=True, slots=True)
class Bar:
    """One minute's bar: where it stands, how tall, and its tooltip."""

    x: float
    y: float
    width: float
    height: float
    label: str


@dataclasses.dataclass(frozen=True, slots=True)
class Chart:
    """The bars of one chart, its size, and a summary for screen readers."""

    width: int
    height: int
    bars: list[Bar]
    peak: int
    total: int

    @property
    def summary(self) -> str:
        return f"{self.total:,} jobs succeeded in the last hour; busiest minute {self.peak:,}"


def minute_bars(
    points: Sequence[tuple[datetime.datetime, int]], now: datetime.datetime, *, width: int = 240, height: int = 36
) -> Chart:
    """Lay out jobs per minute over the hour before ``now`` (the database's clock)."""
    current = now.replace(second=0, microsecond=0)
    first = current - datetime.timedelta(minutes=MINUTES - 1)
    counts = [0] * MINUTES
    for minute, n in points:
        slot = int((minute - first).total_seconds() // 60)
        if 0 <= slot < MINUTES:
            counts[slot] += n
    peak = max(counts)
    step = width / MINUTES
    bars = []
    for i, n in enumerate(counts):
        if n:
            h = max(1.0, (height - 2) * n / peak)
            at = (first + datetime.timedelta(minutes=i)).strftime("%H:%M")
            bars.append(Bar(round(i * step, 2), round(height - h, 2), round(step * 0.8, 2), round(h, 2),
                            f"{at} UTC: {n:,} jobs"))
    return Chart(width, height, bars, peak, sum(counts))
