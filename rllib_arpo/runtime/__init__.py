"""The run-time glue between the algorithm and Ray: what runs beside a training iteration.

- ``rollout_pipeline``: ``sample()`` requests to remote EnvRunners, K of them queued with ``max_staleness`` K;
- ``metrics_export``: key metrics as Ray metrics (``ray_arpo_*``) for the Ray dashboard;
- ``tune_logs``: Tune's loggers, and the rebuilding of a trial's logs from its checkpoint after a restore.
"""
