"""What the run report costs on a trial: saved trees per iteration, the page's build time and size,
and how fast the page loads in headless Chromium.

    python scripts/bench_report.py TRIAL_DIR [--loads 5] [--json out.json]

TRIAL_DIR is one trial's directory (``result.json``, ``rollout_trees.jsonl``). Prints:
    saved trees: iterations with trees, trees, bytes of ``rollout_trees.jsonl`` in all and per
        iteration;
    build: seconds to read the trial and write ``report.html`` (``eval.run_page.write_run_report``,
        best of three), the page's size;
    load in Chromium (Debian's, ``/usr/bin/chromium``, driven by Playwright): the median over
        ``--loads`` fresh pages of the load event (ms after navigation starts) and of the page's
        own time to draw everything up to the first tree (``window.renderMs``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

from rllib_arpo.eval.run_page import HEADLESS_CHROMIUM_FLAGS, write_run_report
from rllib_arpo.eval.saved_trees import SAVED_TREES_FILE, read_saved_trees


def page_loads(page_path: Path, loads: int) -> tuple[float, float]:
    """Median (load event ms, render ms) over ``loads`` fresh pages."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    if executable is None:
        raise SystemExit("needs Debian's chromium (apt-get install chromium)")
    load_ms, render_ms = [], []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=list(HEADLESS_CHROMIUM_FLAGS))
        for _ in range(loads):
            page = browser.new_page()
            page.goto(page_path.as_uri())
            load_ms.append(page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd"))
            render_ms.append(page.evaluate("window.renderMs"))
            page.close()
        browser.close()
    return statistics.median(load_ms), statistics.median(render_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trial_dir", type=Path)
    parser.add_argument("--loads", type=int, default=5, help="page loads measured (the median is printed)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    saved, _ = read_saved_trees(args.trial_dir / SAVED_TREES_FILE)
    trees_bytes = (args.trial_dir / SAVED_TREES_FILE).stat().st_size if saved else 0
    builds = []
    for _ in range(3):
        start = time.perf_counter()
        ((page, _),) = write_run_report(args.trial_dir)
        builds.append(time.perf_counter() - start)
    load_ms, render_ms = page_loads(page, args.loads)
    figures = {
        "iterations_with_trees": len(saved),
        "trees": sum(len(entry["trees"]) for entry in saved.values()),
        "saved_trees_bytes": trees_bytes,
        "saved_trees_bytes_per_iteration": trees_bytes / max(len(saved), 1),
        "build_s": min(builds),
        "page_bytes": page.stat().st_size,
        "load_event_ms": load_ms,
        "render_ms": render_ms,
    }
    print(
        f"saved trees: {figures['iterations_with_trees']} iterations, {figures['trees']} trees, "
        f"{trees_bytes / 1e3:.1f} kB ({figures['saved_trees_bytes_per_iteration'] / 1e3:.1f} kB per iteration)"
    )
    print(f"build: {figures['build_s']:.3f} s (best of 3), report.html {figures['page_bytes'] / 1e3:.1f} kB")
    print(f"load in Chromium (median of {args.loads}): load event {load_ms:.0f} ms, drawn in {render_ms:.0f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
