"""One rule per module. A rule is ``(Context) -> Finding | None``; ``ALL_RULES`` lists them."""

from __future__ import annotations

from collections.abc import Callable

from stallscope.analysis.context import Context
from stallscope.analysis.finding import Finding
from stallscope.analysis.rules import (
    checkpoint_frequency,
    data_persistent_workers,
    data_prefetch,
    data_workers,
    logging_frequency,
    validation_frequency,
)

Rule = Callable[[Context], "Finding | None"]

ALL_RULES: tuple[Rule, ...] = (
    data_workers.rule,
    data_prefetch.rule,
    data_persistent_workers.rule,
    checkpoint_frequency.rule,
    logging_frequency.rule,
    validation_frequency.rule,
)
