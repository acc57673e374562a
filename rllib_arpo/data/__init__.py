"""Prompt datasets: every source becomes a list of ``examples.PromptExample``.

- ``registry``: the dataset types (``DATASET_LOADERS``), ``load_dataset`` and ``dataset_documents``;
- ``loaders``: the built-in types, one module each (``tir_task``, ``parquet``, ``jsonl``, ``reasoning_gym``);
- ``prompts``: how a prompt reaches the model (ARPO's system prompt, the chat template);
- ``prompt_stream``: seeded, shuffled batches of one EnvRunner's shard;
- ``dataset_tools``: the search tool's options for a dataset that brings its own corpus;
- ``tir_task``: the embedded synthetic task; ``demonstrations``: reference-set demonstrations.

Importing this package registers the built-in dataset types.
"""

from rllib_arpo.data.loaders import jsonl, parquet, reasoning_gym, tir_task  # noqa: F401  (registers the dataset types)
