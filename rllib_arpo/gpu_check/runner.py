"""The runner of ``rllib check-gpu``: each ``Piece`` in a daemon thread with its time limit
(``run_piece``), so an exception or a hang in one never stops the others; one line per piece, a
summary and the JSON record (``run_checks``); Ray started for the pieces that start learners."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rllib_arpo.core.time_limit import call_with_time_limit
from rllib_arpo.gpu_check.devices import GPU, Devices
from rllib_arpo.gpu_check.outcomes import FAIL, PASS, SKIP, CheckFailed, Skip


@dataclass(frozen=True)
class Piece:
    """One check: ``check(model, devices)`` returns the measured figures (``model``: a named model
    or a ``save_pretrained`` directory; ``devices``: where it runs, ``Devices``)."""

    name: str
    check: Callable[[str, Devices], dict]
    timeout_s: float
    needs_ray: bool = False  # it starts learners: ``run_checks`` starts Ray first, in its own thread


@dataclass
class PieceResult:
    piece: str
    status: str
    reason: str = ""
    figures: dict = field(default_factory=dict)
    seconds: float = 0.0

    def line(self) -> str:
        figures = ", ".join(f"{k}={_short(v)}" for k, v in self.figures.items())
        detail = "; ".join(part for part in (self.reason, figures) if part)
        return f"{self.piece:<16} {self.status}  {detail} ({self.seconds:.0f} s)"


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def run_piece(piece: Piece, model: str, devices: Devices) -> PieceResult:
    """Run ``piece`` on ``devices`` in a daemon thread for at most ``piece.timeout_s`` seconds."""
    # every failure is reported, none stops the others
    timed = call_with_time_limit(
        lambda: piece.check(model, devices), piece.timeout_s, f"check-{piece.name}", BaseException
    )
    error, seconds = timed.error, timed.seconds
    if timed.timed_out:
        return PieceResult(piece.name, FAIL, f"timed out after {piece.timeout_s:g} s", seconds=seconds)
    if isinstance(error, Skip):
        return PieceResult(piece.name, SKIP, str(error), seconds=seconds)
    if isinstance(error, CheckFailed):
        return PieceResult(piece.name, FAIL, str(error), seconds=seconds)
    if error is not None:
        return PieceResult(piece.name, FAIL, f"{type(error).__name__}: {error}", seconds=seconds)
    return PieceResult(piece.name, PASS, figures=timed.value, seconds=seconds)


def run_checks(pieces: list[Piece], model: str, json_path: str | None = None, devices: Devices | None = None) -> int:
    """Run every piece on ``devices`` (default ``GPU``), print one line each and a summary, write
    them to ``json_path`` (after each piece, so a run cut short keeps what it measured); the exit
    status is 1 if any piece FAILed, else 0."""
    devices = devices or GPU
    results = []
    for piece in pieces:
        if piece.needs_ray and devices.usable():
            start_ray()
        results.append(run_piece(piece, model, devices))
        print(results[-1].line(), flush=True)
        if json_path:
            _write_record(json_path, model, devices, results)
    counts = _counts(results)
    print(f"summary: {counts[PASS]} PASS, {counts[FAIL]} FAIL, {counts[SKIP]} SKIP (model {model})")
    _shutdown_ray()
    return 1 if counts[FAIL] else 0


def _counts(results: list[PieceResult]) -> dict[str, int]:
    return {status: sum(r.status == status for r in results) for status in (PASS, FAIL, SKIP)}


def _write_record(json_path: str, model: str, devices: Devices, results: list[PieceResult]) -> None:
    record = {"model": model, "devices": asdict(devices), "summary": _counts(results)}
    record["pieces"] = [asdict(r) for r in results]
    Path(json_path).write_text(json.dumps(record, indent=2) + "\n")


def start_ray() -> None:
    """Ray, started here unless it runs: in the caller's thread, never a piece's, since Ray's own
    processes (its GCS, raylet) end with the thread that started them (a parent-death signal), and
    a piece's thread ends with the piece."""
    import ray

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)


def _shutdown_ray() -> None:
    import sys

    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()
