"""What an ARPO config holds, below the algorithm that runs it.

- ``fields``: every config field ARPO adds, by group, with its default and doc;
- ``rules``: the one validation of a config (every group, then the rules between groups);
- ``family``: the family's members by name (ARPO, AEPO, GRPO, DAPO, ...): papers and defaults.
"""
