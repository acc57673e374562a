"""Every reward: the registry and its call contract, the rewards group of the config, and each
built-in entry, one module each.

- ``registry``: ``REWARDS``, how a reward is named (``reward.fn``: an entry's name or
  ``module:attribute``), called and checked (``resolve_reward``);
- ``outcomes``: what a call comes to (``RewardValue``) and what a failed call scores;
- ``settings``: ``RewardSettings``, the rewards group's fields (the reward, resolved once, and the
  knobs of the hierarchical reward and of the overlong shaping);
- ``scores``: ``RewardBreakdown`` (one response's reward, format check, S and answer), ``accuracy``
  and ``pass_at_k``;
- ``overlong``: DAPO's overlong shaping, added to any reward;
- the entries: ``hierarchical`` (ARPO's, the default; with ``format_gated``, its format rule for
  the rewards that score an answer their own way), ``environment`` (an environment's return),
  ``llm_judge`` (a chat model behind an OpenAI-compatible server; its messages and verdicts in
  ``judge_prompt``, its requests in ``judge_client``), ``reasoning_gym`` and
  ``verifiers`` (the scorers of those dataset types, whose loaders stay in ``data.loaders``).

The pure scoring it builds on is in ``core``: ``core.answers`` (the final answer),
``core.correctness`` (S: EM, F1, math equivalence) and ``core.tir_format`` (the format check).
This room imports ``core`` and ``data`` (the two scorers read their loaders' environments and
tasks); neither imports it. Importing it registers every built-in entry, so whatever builds a
``RewardSettings`` can name them all.
"""

from rllib_arpo.rewards import environment, hierarchical, llm_judge, reasoning_gym, verifiers  # noqa: F401  (registers the entries)
