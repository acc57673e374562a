"""Each EnvRunner's data position (``rollout.env_runner.DataPosition``: the ``sample()`` calls it
has made and the prompts it has drawn) as the driver records it: after its last ``sample()``
whose batch reached the learner (``ARPO.data_positions``, kept by a checkpoint). After a restore
or a restart every EnvRunner is moved back there, so that no prompt is lost or trained twice and
each rollout is seeded as in an uninterrupted run.
"""

from __future__ import annotations

from rllib_arpo.rollout.env_runner import DataPosition, RolloutBatch
from rllib_arpo.runtime.rollout_pipeline import RolloutPipeline


def push_data_positions(
    env_runner_group,
    data_positions: dict[int, DataPosition],
    pipeline: RolloutPipeline | None,
    local: bool,
    runner_ids: list[int] | None = None,
) -> None:
    """Move every EnvRunner (or the remote ones of ``runner_ids``; with ``local`` the local one)
    to its data position after its last sample that reached the learner, or after the batches
    sampled ahead that the pipeline holds for it (restored from a checkpoint), after a restore or
    a restart."""
    positions = dict(data_positions)
    for runner, results in (pipeline.finished if pipeline is not None else {}).items():
        batches = [result for result in results if isinstance(result, RolloutBatch)]
        if batches:
            positions[runner] = max((batch.position for batch in batches), key=lambda position: position.samples)

    def seek(runner):
        runner.seek(positions.get(runner.worker_index or 0, DataPosition()))

    env_runner_group.foreach_env_runner(seek, local_env_runner=local, remote_worker_ids=runner_ids)
