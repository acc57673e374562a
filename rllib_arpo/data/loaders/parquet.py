"""The ``parquet`` dataset type: verl's RL format, ``{"type": "parquet", "path": ".../train_10k.parquet"}``.

Each row holds ``prompt`` (chat messages), ``ability`` and ``reward_model.ground_truth``, read as
it is: the system prompt is kept byte for byte, including the reference data's mangled
``\\boxed``. The task is ``math`` where ``ability`` says so, else ``qa``. Every other column
(verl's ``extra_info``, a task's test cases) is kept in the example's ``extra``, as plain Python
values, for the reward. Options: ``limit`` (the first rows only) and ``skip_bad_rows`` (``rows``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rllib_arpo.data.examples import PromptExample
from rllib_arpo.data.loaders.rows import BadRow, existing_file, keep_rows, required_field
from rllib_arpo.data.registry import DATASET_LOADERS

READ_COLUMNS = ("prompt", "reward_model", "ability", "data_source")
"""The columns the loader reads itself; every other one goes to ``PromptExample.extra``."""


@DATASET_LOADERS.register("parquet")
def load_parquet(path: str, limit: int | None = None, skip_bad_rows: bool = False) -> list[PromptExample]:
    frame = read_parquet(path)
    missing = {"prompt", "reward_model"} - set(frame.columns)
    if missing:
        raise ValueError(f"{path} is not a verl RL parquet file: missing columns {sorted(missing)}")

    def make(row: Mapping[str, Any]) -> PromptExample:
        prompt = required_field(row, "prompt")
        if len(prompt) == 0:
            raise BadRow("missing field 'prompt' (no messages)")
        messages = []
        for i, message in enumerate(prompt):
            if not isinstance(message, Mapping) or not all(message.get(key) is not None for key in ("role", "content")):
                raise BadRow(f"missing field 'prompt[{i}].role' or 'prompt[{i}].content'")
            for key in ("role", "content"):
                if not isinstance(message[key], str):
                    kind = type(message[key]).__name__
                    raise BadRow(f"field 'prompt[{i}].{key}' holds {kind}, not text (write it as UTF-8 strings)")
            messages.append({"role": message["role"], "content": message["content"]})
        truth = required_field(required_field(row, "reward_model"), "ground_truth")
        task = "math" if row.get("ability", "qa") == "math" else "qa"
        extra = {name: plain(value) for name, value in row.items() if name not in READ_COLUMNS}
        source = row.get("data_source") or Path(path).stem
        return PromptExample(tuple(messages), str(truth), task, source, extra=extra)

    rows = enumerate(frame.to_dict("records"))  # row numbers from 0, as pandas counts them
    return keep_rows(path, rows, make, skip_bad_rows, limit)


def plain(value: Any) -> Any:
    """A value as pandas reads it from a parquet cell, as plain Python: numpy arrays as lists and
    numpy scalars as numbers, inside lists and mappings too."""
    if isinstance(value, np.ndarray):
        return [plain(item) for item in value]
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    return value


def read_parquet(path: str):
    """The parquet file as a DataFrame; a column whose text is not valid UTF-8 is named."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(existing_file(path))
    try:
        return table.to_pandas()
    except pa.ArrowException as error:
        for name in table.column_names:
            try:
                table.select([name]).to_pandas()
            except pa.ArrowException:
                reason = " ".join(str(error).split())
                raise ValueError(f"{path}: column {name!r} holds text that is not valid UTF-8 ({reason})") from None
        raise
