"""A Tune trial's directory on the local disk: where its result files go (``result.json``,
``rollout_trees.jsonl``, its checkpoints), and the record of its checkpoints that a trial
continues from after a hard kill, rather than Tune's experiment state (whose record of a
checkpoint may then be stale: ``is_stale_record``).
"""

from __future__ import annotations

from pathlib import Path

from rllib_arpo.learner.checkpoint import checkpoints_in, latest_complete_checkpoint


def trial_directory(storage, logdir: str) -> Path:
    """Where the trial's results are (Tune's local ``storage``: ``result.json``, checkpoints), or
    the Trainable's own directory ``logdir`` otherwise."""
    if storage is not None and storage.storage_filesystem.type_name == "local":
        return Path(storage.trial_fs_path)
    return Path(logdir)


def continue_from_latest_checkpoint_on_disk(trainable) -> Path | None:
    """Under Tune, restore ``trainable`` from the latest complete checkpoint in its trial's
    directory, and number the next checkpoint after every one there, so that none is overwritten.

    Tune records a trial's checkpoints in its experiment state every few seconds, so after a
    hard kill (SIGKILL, a preempted node) ``--resume`` finds a record that names an older
    checkpoint or none and would start the trial again at iteration 1, writing
    ``checkpoint_000000`` over the old one. The disk is the record here: an incomplete
    checkpoint (``learner.checkpoint.checkpoint_problem``) is passed over, with its reason."""
    storage = trainable._storage
    if storage is None or storage.storage_filesystem.type_name != "local":
        return None
    checkpoints = checkpoints_in(storage.trial_fs_path)
    if not checkpoints:  # a new trial
        return None
    storage.current_checkpoint_index = max(checkpoints)  # Tune adds 1 before it writes one
    latest, passed_over = latest_complete_checkpoint(checkpoints)
    for path, problem in passed_over:
        print(f"[resume] passing over {path}: {problem}", flush=True)
    if latest is None:
        return None
    trainable.restore_from_path(latest)
    print(
        f"[resume] restored from {latest}, the latest complete checkpoint (iteration {trainable.iteration})",
        flush=True,
    )
    return latest


def is_stale_record(checkpoint_path, continued_from: Path | None) -> bool:
    """Whether the checkpoint Tune's restore of a trial names (``Trainable.restore``'s argument)
    is one of this trial's own checkpoints while the trial already continued from
    ``continued_from`` (``continue_from_latest_checkpoint_on_disk``), which is at least as recent:
    Tune's record of it is stale, and it is not restored again (said so on stdout)."""
    checkpoint = getattr(checkpoint_path, "checkpoint", checkpoint_path)
    named = Path(getattr(checkpoint, "path", checkpoint))
    if continued_from is not None and named.parent == continued_from.parent:
        print(f"[resume] Tune's experiment state names {named.name}; continuing from {continued_from.name}", flush=True)
        return True
    return False
