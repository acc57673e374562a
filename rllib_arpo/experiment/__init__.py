"""An experiment before Ray starts, above the algorithm it builds.

- ``file``: an experiment YAML read and checked (paths, types, ranges, engine options);
- ``dry_run``: the ``--dry-run`` report (experiment, resources, learner memory, prompts).
"""
