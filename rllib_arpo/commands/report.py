"""``rllib report RUN_DIR``: the run report as one HTML page per trial (curves, held-out table,
rollout trees; ``eval.run_page``), also written at the end of ``rllib train`` and ``rllib evaluate``."""

from __future__ import annotations

import sys
from pathlib import Path


def print_run_report(run_dir: str | Path) -> int:
    """Write the run report of ``run_dir`` (``eval.run_page.write_run_report``) and print each
    page's path with what its run lacks, one line each; 1 where there is nothing to report."""
    from rllib_arpo.eval.run_page import ReportError, write_run_report

    try:
        pages = write_run_report(run_dir)
    except ReportError as error:
        print(f"rllib report: {error}", file=sys.stderr)
        return 1
    for page, notes in pages:
        print(f"report: {page}" + (f" (missing: {'; '.join(notes)})" if notes else ""))
    return 0
