"""Retry policy: how long a failed job waits before its next attempt.

The delay itself is computed in SQL from database time (see ``fail`` in ``queries.sql``); this
module holds and validates the parameters, and mirrors the formula for documentation and tests.
"""

from __future__ import annotations

import dataclasses
import math

from ._errors import ConfigurationError


@dataclasses.dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter, capped.

    The n-th retry (n = 1 after the first failed attempt) waits
    ``min(max_delay, base * factor ** (n - 1) * (1 + jitter * u))`` seconds, where ``u`` is
    uniform in [-1, 1]. With the defaults: about 1s, 2s, 4s, ... up to an hour.
    """

    base: float = 1.0
    factor: float = 2.0
    max_delay: float = 3600.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        checks = (
            ("base", self.base, 0.0, 86400.0 * 365),
            ("factor", self.factor, 1.0, 10.0),
            ("max_delay", self.max_delay, 0.0, 86400.0 * 365),
            ("jitter", self.jitter, 0.0, 1.0),
        )
        for name, value, low, high in checks:
            if not isinstance(value, int | float) or not math.isfinite(value):
                raise ConfigurationError(f"Backoff.{name} must be a finite number, got {value!r}")
            if not low <= value <= high:
                raise ConfigurationError(f"Backoff.{name} must be in [{low}, {high}], got {value!r}")

    def bounds(self, attempt: int) -> tuple[float, float]:
        """Return the (shortest, longest) wait after failed attempt number ``attempt``."""
        core = self.base * self.factor ** min(attempt - 1, 64)
        return (
            min(self.max_delay, core * (1 - self.jitter)),
            min(self.max_delay, core * (1 + self.jitter)),
        )
