"""What an ARPO config holds, below the algorithm that runs it.

- ``fields``: every config field ARPO adds, by group, with its default and doc (``CONFIG_GROUPS``);
  the policy, data, tool-use and held-out groups, and the lookups of a field's group and name;
- ``training_fields``, ``learner_fields``: the training group (advantages, the policy loss) and the
  learners group (backend, precision, memory, weight sync, LoRA);
- ``checks``: the checks of a value the groups share (a lower bound, a registered name);
- ``rllib_fields``: RLlib's own fields that ARPO reads, their types and ranges;
- ``reference``: the configuration reference (docs/configuration.md) from the fields' docs;
- ``rules``: the one validation of a config (every group, then the rules between groups);
- ``family``: the family's members by name (ARPO, AEPO, GRPO, DAPO, ...): papers and defaults;
- ``group_setters``: ``ARPOConfig``'s fluent setters, one per field group (``.policy(...)``, ...).
"""
