"""The built-in dataset types, one module each, named as the config's ``dataset.type``.

- ``{"type": "tir_task", "seed": 0, "split": "train"}``: the embedded task (``tir_task``);
- ``{"type": "parquet", "path": ".../train_10k.parquet"}``: verl's RL format (``parquet``);
- ``{"type": "jsonl", "path": ".../gsm8k.jsonl"}``: question / answer lines (``jsonl``);
- ``{"type": "reasoning_gym", "task": "basic_arithmetic"}``: a procedural task of the reasoning-gym
  library, scored by the ``reasoning_gym`` reward (``rewards.reasoning_gym``; an optional extra);
- ``{"type": "verifiers", "env": "my_env"}``: a single-turn environment of the verifiers library, with
  its reward functions as the ``verifiers`` reward (``rewards.verifiers``; an optional extra);
- ``{"type": "session_lookup", "size": 200}``: questions whose answer is a value that only the
  ``python_session`` environment holds (``session_lookup``).

Each registers itself in ``data.registry.DATASET_LOADERS`` when imported (``rllib_arpo.data``
imports them all). A row of a file without a field it needs raises ``rows.BadRow``.
"""
