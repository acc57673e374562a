"""The cold start: supervised fine-tuning on tool-use demonstrations before RL (arXiv 2507.19849,
Sec. 4.1).

- ``sft``: the trainer (demonstration transcripts tokenised as the rollout builds them, the copy
  drill, the loss, ``warm_start`` of a loaded model and ``cold_start`` of a saved chat model);
- ``saved_tiny_policy``: the tiny policy of ``models.tiny_policy`` with a tokenizer trained on
  the embedded task's demonstrations, warm-started and saved (``model_path: tiny``'s build).

It sits beside the training code rather than in ``models/``: it trains, and it reads the
embedded task (``data``) and runs its tools (``tools``); ``models/`` imports none of it.
"""
