"""tune_logs: after a restore, a trial's result.json, progress.csv and TensorBoard events hold the
checkpoint's rows, then the new one, each iteration once."""

import csv
import json

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboardX import SummaryWriter

from rllib_arpo.learner.checkpoint import RESULTS_FILE, results_up_to, write_manifest
from rllib_arpo.tune_logs import csv_row, rewrite_logs


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


def test_the_logs_hold_the_checkpoint_rows_then_the_new_one(tmp_path):
    staging, storage = tmp_path / "staging", tmp_path / "storage"
    staging.mkdir()
    storage.mkdir()
    # storage: an events file of the killed run with iterations 1..5 (5 came after the checkpoint)
    with SummaryWriter(str(storage), filename_suffix=".killed") as killed:
        for iteration in range(1, 6):
            killed.add_scalar("ray/tune/learners/loss", iteration / 4, iteration)
    # staging: Tune's copies of the stored files (saved at iteration 2: rows 1, 2), then row 4 just logged
    new_row = {**row(4), "evaluation": {"score": 0.5}}  # a column the old rows lack
    (staging / "result.json").write_text("".join(json.dumps(r) + "\n" for r in [row(1), row(2), new_row]))
    with (staging / "progress.csv").open("w", newline="") as progress:
        stale = csv.DictWriter(progress, list(csv_row(row(1))))
        stale.writeheader()
        stale.writerows([csv_row(row(1)), csv_row(row(2))])
        csv.DictWriter(progress, list(csv_row(new_row))).writerow(csv_row(new_row))
    with SummaryWriter(str(staging)) as being_written:
        being_written.add_scalar("ray/tune/learners/loss", 1.0, 4)
    earlier = [json.dumps(row(i)) for i in (1, 2, 3)]

    rewrite_logs(staging, storage, earlier, list(csv_row(new_row)))

    assert (staging / "result.json").read_text().splitlines() == [*earlier, json.dumps(new_row)]
    with (staging / "progress.csv").open(newline="") as progress:
        reader = csv.DictReader(progress)
        rows = list(reader)
    assert reader.fieldnames == ["training_iteration", "timestamp", "learners/loss", "evaluation/score"]
    assert [(r["training_iteration"], r["learners/loss"], r["evaluation/score"]) for r in rows] == [
        ("1", "0.25", ""), ("2", "0.5", ""), ("3", "0.75", ""), ("4", "1.0", "0.5"),
    ]  # fmt: skip
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
