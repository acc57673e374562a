"""Prompt datasets: every source becomes a list of ``examples.PromptExample``.

- ``registry``: the dataset types (``DATASET_LOADERS``), ``load_dataset`` and ``dataset_documents``;
- ``loaders``: the built-in types, one module each (``tir_task``, ``parquet``, ``jsonl``, ``reasoning_gym``,
  ``verifiers``, ``session_lookup``);
- ``prompts``: how a prompt reaches the model (ARPO's system prompt, the chat template);
- ``prompt_stream``: seeded, shuffled batches of one EnvRunner's shard;
- ``dataset_tools``: the search tool's options for a dataset that brings its own corpus;
- ``tir_task``: the embedded synthetic task; ``demonstrations``: reference-set demonstrations.

Importing this package registers the built-in dataset types. The rewards that score two of them,
``reasoning_gym`` and ``verifiers``, live with every other reward in ``rllib_arpo.rewards``, which
imports these loaders (nothing here imports a reward).
"""

from rllib_arpo.data.loaders import jsonl, parquet, reasoning_gym, session_lookup, tir_task, verifiers  # noqa: F401  (registers the dataset types)
