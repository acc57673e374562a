"""Reading a dataset file row by row: the ``BadRow`` error and what ``skip_bad_rows`` does with it.

A row without a field it needs raises ``BadRow`` naming the file, the row and the field;
``skip_bad_rows: true`` (parquet and jsonl) skips such rows instead and logs how many.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rllib_arpo.data.examples import PromptExample

logger = logging.getLogger(__name__)


class BadRow(ValueError):
    """A dataset row without a field it needs; the message names the file, the row and the field."""


def keep_rows(path: str, rows, make: Callable[[Any], PromptExample], skip_bad_rows: bool, limit: int | None):
    """``make(row)`` for each (row number, row) of ``rows`` until ``limit`` examples. A ``BadRow``
    raises with ``path:row:`` in front, or with ``skip_bad_rows`` is skipped, counted and logged."""
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a whole number >= 1 (or absent: every row), got {limit!r}")
    examples, skipped = [], []
    for number, row in rows:
        try:
            examples.append(make(row))
        except BadRow as error:
            if not skip_bad_rows:
                raise BadRow(f"{path}: row {number}: {error} (skip_bad_rows: true skips such rows)") from None
            skipped.append(f"row {number}: {error}")
        if limit and len(examples) >= limit:
            break
    if skipped:
        logger.warning("%s: skipped %d bad rows (%s)", path, len(skipped), "; ".join(skipped[:5]))
    return examples


def required_field(record: Mapping[str, Any], name: str) -> Any:
    """``record[name]``; ``BadRow`` naming the field when it is missing, None or NaN."""
    value = record.get(name) if isinstance(record, Mapping) else None
    if value is None or (isinstance(value, float) and value != value):
        raise BadRow(f"missing field {name!r}")
    return value


def existing_file(path: str) -> Path:
    """``path`` with ``~`` expanded; FileNotFoundError naming it when it is not a file."""
    resolved = Path(path).expanduser()
    if not resolved.is_file():
        raise FileNotFoundError(f"dataset file {resolved} does not exist")
    return resolved
