"""The run-time glue between the algorithm and Ray: what runs beside a training iteration.

- ``rollout_pipeline``: ``sample()`` requests to remote EnvRunners, K of them queued with ``max_staleness`` K;
- ``metrics_export``: key metrics as Ray metrics (``ray_arpo_*``) for the Ray dashboard;
- ``tune_logs``: Tune's loggers, and the rebuilding of a trial's logs from its checkpoint after a restore;
- ``prompt_groups``: an iteration's batch by prompt, filled by DAPO's dynamic sampling or one round;
- ``env_runner_sampling``: ``sample()`` on every EnvRunner through restarts, each batch checked and counted;
- ``data_positions``: each EnvRunner moved back to its data position after a restore or a restart;
- ``weight_push``: the learner's weights to the EnvRunners, versioned, the way ``weight_sync`` says;
- ``checkpoint_files``: what a checkpoint holds beside RLlib's state (policy, partitions, result rows, manifest);
- ``trial_directory``: a trial's directory, and its continuation from the latest complete checkpoint there.
"""
