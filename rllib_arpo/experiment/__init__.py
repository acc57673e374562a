"""An experiment before Ray starts, above the algorithm it builds.

- ``file``: an experiment YAML read (imports, paths, the trials to check) and checked;
- ``checks``: the checks of its values (types, ranges, engine options, datasets, tools, stop keys,
  ``checkpoint_config``), each problem a one-line ``ConfigError``;
- ``dry_run``: the ``--dry-run`` report (experiment, resources, learner memory, prompts).
"""
