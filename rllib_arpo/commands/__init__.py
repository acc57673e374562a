"""What each ``rllib`` command does, one module per command: ``train.py`` (``rllib train file``,
its dry run and ``--resume``), ``evaluate.py`` (``rllib evaluate``), ``cold_start.py`` (``rllib
cold-start``), ``check_gpu.py`` (``rllib check-gpu``) and ``report.py`` (``rllib report``, also
written at the end of ``rllib train`` and ``rllib evaluate``). ``cli.py`` above parses the command
line and calls them; a problem with the input raises ``ConfigError``, which it prints as one line."""
