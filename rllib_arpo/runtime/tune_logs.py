"""A trial's logs (``result.json``, ``progress.csv``, TensorBoard events) hold every iteration
once, also after the trial continues from a checkpoint.

Ray Tune 2.60's loggers (``JsonLoggerCallback``, ``CSVLoggerCallback``, ``TBXLoggerCallback``)
write a trial's logs in a staging directory of the driver
(``/tmp/ray/session_*/artifacts/<time>/<experiment>/driver_artifacts/<trial>``), which Tune copies
to the storage path only when it saves the experiment state
(``_ExperimentCheckpointManager.sync_up_experiment_state``, every 10 s or more). When a trial
starts again (``--resume``), a new staging directory begins with the stored ``result.json`` and
``progress.csv``, and only if the experiment state names a checkpoint
(``LoggerCallback._restore_from_remote``); the new rows are appended there and the next save
copies the files over the stored ones; TensorBoard gets a new events file. So after a hard kill
the rows logged since the last save are lost for good (those up to the checkpoint the trial
continues from included), and rows logged after that checkpoint may appear twice.

Here every checkpoint keeps the rows of its iterations (``learner.checkpoint.RESULTS_FILE``,
written by ``ARPO.save_to_path``), and ``LogsFromCheckpoint``, placed after Tune's loggers,
rewrites a trial's logs on its first result after a restore: the rows of iterations 1..k-1 from
the checkpoint of iteration k-1, then row k. Each file is replaced whole (``replacing``), and the
old TensorBoard events go only once the new ones are written, so a failure midway (a full disk, a
kill) leaves every log complete, old or new.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from ray.tune import Callback
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback
from ray.tune.result import TRAINING_ITERATION
from ray.tune.utils import flatten_dict

from rllib_arpo.learner.checkpoint import results_up_to

RESULT_FILE = "result.json"
PROGRESS_FILE = "progress.csv"
EVENTS_PATTERN = "events.out.tfevents.*"


def csv_row(result: dict) -> dict:
    """A result as ``CSVLoggerCallback`` writes it: without ``config``, nested keys joined by ``/``."""
    return flatten_dict({key: value for key, value in result.items() if key != "config"}, delimiter="/")


class _LogDirectory:
    """What ``TBXLoggerCallback`` reads of a trial: where to write, and no hyperparameters."""

    evaluated_params = None

    def __init__(self, path: Path) -> None:
        self.local_path = str(path)

    def init_local_path(self) -> None:
        Path(self.local_path).mkdir(parents=True, exist_ok=True)


@contextmanager
def replacing(path: Path, mode: str = "w") -> Iterator[IO]:
    """A file opened with ``mode`` whose content replaces ``path`` when the block ends: a temporary
    file in the same folder, flushed to disk, then renamed over ``path`` (``os.replace``, atomic).
    Where the block raises, the temporary file is removed and ``path`` stays as it was. Its name
    holds no ``tfevents``: TensorBoard reads no half-written copy."""
    temporary = path.parent / f".rewriting.{os.getpid()}.tmp"
    try:
        with open(temporary, mode) as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_tensorboard(rows: list[dict], directory: Path) -> Path:
    """The TensorBoard events of ``rows`` as ``TBXLoggerCallback`` writes them, in one file of
    ``directory`` named after the first row's time (so that TensorBoard reads it before the
    files of later runs: an older step after a newer one would make it drop the newer ones)."""
    with tempfile.TemporaryDirectory() as scratch:  # outside the directory Tune copies to storage
        logger, trial = TBXLoggerCallback(), _LogDirectory(Path(scratch))
        for row in rows:
            logger.log_trial_result(row[TRAINING_ITERATION], trial, row)
        logger.log_trial_end(trial)
        [written] = Path(scratch).glob(EVENTS_PATTERN)
        target = directory / f"events.out.tfevents.{rows[0]['timestamp']:010d}.restored"
        with replacing(target, "wb") as file:
            file.write(written.read_bytes())
        return target


def rewrite_logs(staging: Path, storage: Path, earlier: list[str], fieldnames: list[str]) -> None:
    """Tune's logs of a trial after its first result k since a restore: in ``staging``, where
    Tune's loggers have just written row k (the last row of each file), ``result.json`` and
    ``progress.csv`` become the rows ``earlier`` (JSON lines of iterations 1..k-1), then row k; the
    CSV header is ``fieldnames``, the columns Tune's CSV logger writes from now on. TensorBoard
    gets ``earlier`` in a file of their own; once it is written, every other events file but the
    one being written goes, from ``staging`` and from ``storage`` (where Tune copies the staging
    files). Each file is replaced whole (``replacing``): Tune's loggers must open them again
    (``LogsFromCheckpoint.reopen``)."""
    rows = [json.loads(line) for line in earlier]
    result_file = staging / RESULT_FILE
    latest_result = result_file.read_text().splitlines()[-1]
    with replacing(result_file) as file:
        file.write("".join(line + "\n" for line in [*earlier, latest_result]))

    progress_file = staging / PROGRESS_FILE
    latest = list(csv.reader(io.StringIO(progress_file.read_text())))[-1]
    with replacing(progress_file) as file:
        writer = csv.DictWriter(file, fieldnames, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(csv_row(row) for row in rows)
        csv.writer(file).writerow(latest)

    [being_written, *older] = sorted(staging.glob(EVENTS_PATTERN), key=lambda file: file.stat().st_mtime, reverse=True)
    restored = write_tensorboard(rows, staging)
    kept = {being_written.name, restored.name}  # a restore before in this trial wrote a file of that name
    for file in [*older, *storage.glob(EVENTS_PATTERN)]:
        if file.name not in kept:
            file.unlink()


class LogsFromCheckpoint(Callback):
    """After Tune's loggers (``trial_loggers``): on a trial's first result after it continued from
    the checkpoint of iteration k-1, its logs are rewritten to hold iterations 1..k-1 from that
    checkpoint, then k (``rewrite_logs``), and ``json_logger`` and ``csv_logger`` append to the new
    files. For a storage path on the local file system (as ``rllib train file``'s always is), where
    the checkpoints can be read."""

    def __init__(self, json_logger: JsonLoggerCallback, csv_logger: CSVLoggerCallback) -> None:
        self.json_logger, self.csv_logger = json_logger, csv_logger

    def reopen(self, trial) -> None:
        """Tune's JSON and CSV loggers' files of ``trial`` opened again: ``rewrite_logs`` replaced
        them, and the files they held open are no longer in the folder. (Ray 2.60's loggers keep
        them in ``_trial_files``, the CSV writer in ``_trial_csv``.)"""
        for files in (self.json_logger._trial_files, self.csv_logger._trial_files):
            files[trial].close()
            files[trial] = open(files[trial].name, "a")  # noqa: SIM115 (the logger holds it open and closes it)
        writer = self.csv_logger._trial_csv[trial]
        self.csv_logger._trial_csv[trial] = csv.DictWriter(self.csv_logger._trial_files[trial], writer.fieldnames)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        continued = result[TRAINING_ITERATION] - 1
        if result.get("iterations_since_restore") != 1 or continued == 0:
            return
        if trial.storage.storage_filesystem.type_name != "local":
            return
        earlier = results_up_to(trial.storage.trial_fs_path, continued)
        if earlier is None:
            print(f"[resume] no checkpoint keeps the results of iterations 1..{continued}: the logs keep Tune's rows")
            return
        rewrite_logs(Path(trial.local_path), Path(trial.storage.trial_fs_path), earlier, list(csv_row(result)))
        self.reopen(trial)


def trial_loggers() -> list[Callback]:
    """Tune's three loggers, then ``LogsFromCheckpoint`` (the callbacks of ``rllib train file``)."""
    json_logger, csv_logger = JsonLoggerCallback(), CSVLoggerCallback()
    return [json_logger, csv_logger, TBXLoggerCallback(), LogsFromCheckpoint(json_logger, csv_logger)]
