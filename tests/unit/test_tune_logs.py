"""tune_logs: after a restore, a trial's result.json, progress.csv and TensorBoard events hold the
checkpoint's rows, then the new ones, each iteration once; a failure midway leaves each log
complete."""

import builtins
import csv
import errno
import io
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboardX import SummaryWriter

import rllib_arpo.runtime.tune_logs
from rllib_arpo.learner.checkpoint import RESULTS_FILE, results_up_to, write_manifest
from rllib_arpo.runtime.tune_logs import TBXLoggerCallback, csv_row, rewrite_logs, trial_loggers


def row(iteration: int) -> dict:
    return {
        "training_iteration": iteration,
        "timestamp": 1_700_000_000 + iteration,
        "learners": {"loss": iteration / 4},
        "config": {"lr": 0.1},
    }


def tensorboard_steps(directory) -> list[int]:
    # purge_orphaned_data off: a step written twice shows twice
    events = EventAccumulator(str(directory), purge_orphaned_data=False)
    events.Reload()
    return [event.step for event in events.Scalars("ray/tune/learners/loss")]


def event_files(directory) -> list[str]:
    return sorted(file.name for file in Path(directory).glob("events.out.tfevents.*"))


NEW_ROW = {**row(4), "evaluation": {"score": 0.5}}  # a column the old rows lack
EARLIER = [json.dumps(row(i)) for i in (1, 2, 3)]  # the checkpoint of iteration 3 keeps these


def stored_logs(tmp_path):
    """A trial continued from the checkpoint of iteration 3, before row 4: its storage folder
    (the events file of the killed run, iterations 1..5: 4 and 5 came after the checkpoint) and
    its staging folder, with Tune's copies of the stored result.json and progress.csv (saved at
    iteration 2: rows 1, 2)."""
    staging, storage = tmp_path / "staging", tmp_path / "storage"
    staging.mkdir()
    storage.mkdir()
    with SummaryWriter(str(storage), filename_suffix=".killed") as killed:
        for iteration in range(1, 6):
            killed.add_scalar("ray/tune/learners/loss", iteration / 4, iteration)
    (staging / "result.json").write_text("".join(json.dumps(r) + "\n" for r in [row(1), row(2)]))
    with (staging / "progress.csv").open("w", newline="") as progress:
        stale = csv.DictWriter(progress, list(csv_row(row(1))))
        stale.writeheader()
        stale.writerows([csv_row(row(1)), csv_row(row(2))])
    return staging, storage


def restored_trial(tmp_path):
    """``stored_logs`` after Tune's loggers wrote row 4: appended to result.json and progress.csv,
    and in an events file of its own."""
    staging, storage = stored_logs(tmp_path)
    with (staging / "result.json").open("a") as result:
        result.write(json.dumps(NEW_ROW) + "\n")
    with (staging / "progress.csv").open("a", newline="") as progress:
        csv.DictWriter(progress, list(csv_row(NEW_ROW))).writerow(csv_row(NEW_ROW))
    with SummaryWriter(str(staging)) as being_written:
        being_written.add_scalar("ray/tune/learners/loss", 1.0, 4)
    return staging, storage


def progress_rows(staging) -> tuple[list[str], list[tuple]]:
    with (staging / "progress.csv").open(newline="") as progress:
        reader = csv.DictReader(progress)
        rows = [(r["training_iteration"], r["learners/loss"], r["evaluation/score"]) for r in reader]
    return reader.fieldnames, rows


def test_the_logs_hold_the_checkpoint_rows_then_the_new_one(tmp_path):
    staging, storage = restored_trial(tmp_path)

    rewrite_logs(staging, storage, EARLIER, list(csv_row(NEW_ROW)))

    assert (staging / "result.json").read_text().splitlines() == [*EARLIER, json.dumps(NEW_ROW)]
    assert progress_rows(staging) == (
        ["training_iteration", "timestamp", "learners/loss", "evaluation/score"],
        [("1", "0.25", ""), ("2", "0.5", ""), ("3", "0.75", ""), ("4", "1.0", "0.5")],
    )
    assert tensorboard_steps(staging) == [1, 2, 3, 4]
    assert not list(storage.glob("events.out.tfevents.*"))  # the killed run's events are gone


def test_the_rows_come_from_the_complete_checkpoint_of_that_iteration(tmp_path):
    def checkpoint(number: int, iterations: int):
        path = tmp_path / f"checkpoint_{number:06d}"
        path.mkdir()
        (path / RESULTS_FILE).write_text("".join(json.dumps(row(i)) + "\n" for i in range(1, iterations + 1)))
        write_manifest(path)

    checkpoint(0, 2)
    checkpoint(1, 4)
    checkpoint(2, 6)
    (tmp_path / "checkpoint_000002" / RESULTS_FILE).write_text("")  # cut short
    assert results_up_to(tmp_path, 4) == [json.dumps(row(i)) for i in range(1, 5)]
    assert results_up_to(tmp_path, 2) == [json.dumps(row(i)) for i in (1, 2)]
    assert results_up_to(tmp_path, 6) is None


def disk_full_at(monkeypatch, directory: Path, nth: int) -> None:
    """The ``nth`` file opened for writing in ``directory`` takes half of the first text written
    to it, then fails as a full disk does."""
    real_open, opened = io.open, []

    def open_(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        if "r" not in mode and isinstance(file, str | os.PathLike) and Path(file).parent == directory:
            opened.append(file)
            if len(opened) == nth:
                write = handle.write

                def half_then_full(data):
                    write(data[: len(data) // 2])
                    handle.flush()
                    raise OSError(errno.ENOSPC, "No space left on device")

                handle.write = half_then_full
        return handle

    monkeypatch.setattr(io, "open", open_)  # Path.write_text's
    monkeypatch.setattr(builtins, "open", open_)


@pytest.mark.parametrize("nth", [1, 2, 3])
def test_a_disk_full_midway_leaves_each_log_whole_old_or_new(tmp_path, monkeypatch, nth):
    """The files are rewritten in turn: result.json (1), progress.csv (2), the restored events (3).
    Each either is the new file or is still the old one, byte for byte, and no partial copy stays.
    (Broken on purpose: with result.json and progress.csv written in place, as before, case 1 leaves
    half a line of JSON, case 2 half a header.)"""
    staging, storage = restored_trial(tmp_path)
    old = {name: (staging / name).read_bytes() for name in ("result.json", "progress.csv")}
    listing, events = sorted(os.listdir(staging)), (event_files(staging), event_files(storage))
    disk_full_at(monkeypatch, staging, nth)

    with pytest.raises(OSError, match="No space left on device"):
        rewrite_logs(staging, storage, EARLIER, list(csv_row(NEW_ROW)))
    monkeypatch.undo()

    still_old = {name: (staging / name).read_bytes() == text for name, text in old.items()}
    assert still_old == {"result.json": nth == 1, "progress.csv": nth <= 2}
    if nth > 1:
        assert (staging / "result.json").read_text().splitlines() == [*EARLIER, json.dumps(NEW_ROW)]
    assert sorted(os.listdir(staging)) == listing  # no temporary file left behind, no events file gone
    assert (event_files(staging), event_files(storage)) == events
    assert tensorboard_steps(storage) == [1, 2, 3, 4, 5]


def test_a_failure_while_writing_the_new_events_leaves_the_old_ones(tmp_path, monkeypatch):
    """(Broken on purpose: removing the old events files before writing the new one, as before,
    leaves the storage folder with none and the staging folder with row 4 only.)"""

    class FailingAfterOneRow(TBXLoggerCallback):
        def log_trial_result(self, iteration, trial, result):
            if iteration > 1:
                raise OSError(errno.ENOSPC, "No space left on device")
            super().log_trial_result(iteration, trial, result)

    staging, storage = restored_trial(tmp_path)
    events = (event_files(staging), event_files(storage))
    monkeypatch.setattr(rllib_arpo.runtime.tune_logs, "TBXLoggerCallback", FailingAfterOneRow)

    with pytest.raises(OSError, match="No space left on device"):
        rewrite_logs(staging, storage, EARLIER, list(csv_row(NEW_ROW)))

    assert (event_files(staging), event_files(storage)) == events
    assert (tensorboard_steps(staging), tensorboard_steps(storage)) == ([4], [1, 2, 3, 4, 5])


def test_a_second_restore_in_the_same_staging_folder_keeps_its_rewritten_events(tmp_path):
    """Tune restarts a failed trial in its staging folder: the events file written at the first
    restore has the name of the one the second restore writes. (Broken on purpose: removing every
    older events file after writing the new one deletes the new one, and TensorBoard shows step 4
    only.)"""
    staging, storage = restored_trial(tmp_path)
    rewrite_logs(staging, storage, EARLIER, list(csv_row(NEW_ROW)))
    with SummaryWriter(str(staging), filename_suffix=".again") as again:  # row 4 of the second restore
        again.add_scalar("ray/tune/learners/loss", 1.0, 4)
    [second] = staging.glob("events.out.tfevents.*.again")
    newest = max(file.stat().st_mtime_ns for file in staging.glob("events.out.tfevents.*")) + 10**9
    os.utime(second, ns=(newest, newest))  # it is the one being written

    rewrite_logs(staging, storage, EARLIER, list(csv_row(NEW_ROW)))

    assert event_files(staging) == sorted([f"events.out.tfevents.{row(1)['timestamp']}.restored", second.name])
    assert tensorboard_steps(staging) == [1, 2, 3, 4]


class Trial:
    """What Tune's loggers and ``LogsFromCheckpoint`` read of a trial restored from a checkpoint
    (``trial.checkpoint`` None: the staging folder holds Tune's copies of the stored logs already)."""

    config, evaluated_params, checkpoint = {}, None, None

    def __init__(self, staging: Path, storage: Path) -> None:
        self.local_path = str(staging)
        self.storage = SimpleNamespace(
            trial_fs_path=str(storage), storage_filesystem=SimpleNamespace(type_name="local")
        )

    def init_local_path(self) -> None:
        Path(self.local_path).mkdir(parents=True, exist_ok=True)


def test_tunes_loggers_append_the_rows_after_the_restore_to_the_rewritten_files(tmp_path):
    """``trial_loggers`` on rows 4 and 5 of a trial restored from the checkpoint of iteration 3.
    (Broken on purpose: without ``LogsFromCheckpoint.reopen``, Tune's JSON and CSV loggers write
    row 5 into the files that the rewrite replaced, and result.json ends at row 4.)"""
    staging, storage = stored_logs(tmp_path)
    checkpoint = storage / "checkpoint_000000"
    checkpoint.mkdir()
    (checkpoint / RESULTS_FILE).write_text("".join(line + "\n" for line in EARLIER))
    write_manifest(checkpoint)
    trial, callbacks = Trial(staging, storage), trial_loggers()
    after_restore = [{**NEW_ROW, "iterations_since_restore": 1}, {**row(5), "iterations_since_restore": 2}]

    for result in after_restore:
        for callback in callbacks:
            callback.on_trial_result(0, [trial], trial, result)
    for callback in callbacks:
        callback.on_trial_complete(0, [trial], trial)

    assert (staging / "result.json").read_text().splitlines() == [*EARLIER, *map(json.dumps, after_restore)]
    assert progress_rows(staging)[1] == [
        ("1", "0.25", ""), ("2", "0.5", ""), ("3", "0.75", ""), ("4", "1.0", "0.5"), ("5", "1.25", ""),
    ]  # fmt: skip
    assert tensorboard_steps(staging) == [1, 2, 3, 4, 5]
