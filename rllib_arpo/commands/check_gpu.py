"""``rllib check-gpu``: PASS / FAIL / SKIP for each piece a GPU machine must run (``gpu_check``); exit
status 1 if any piece fails."""

from __future__ import annotations

import argparse

from rllib_arpo.gpu_check.devices import devices_for
from rllib_arpo.gpu_check.pieces import PIECES
from rllib_arpo.gpu_check.runner import run_checks


def check_gpu(args: argparse.Namespace) -> int:
    """``rllib check-gpu``: the pieces of ``gpu_check.pieces.PIECES`` (or ``--only`` those), in order,
    on the devices ``--device`` and ``--engine`` name."""
    pieces = [PIECES[name] for name in args.only or PIECES]
    return run_checks(pieces, args.model, args.json, devices_for(args.device, args.engine))
