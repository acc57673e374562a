"""Throughput of the tools: calls per second of the Python sandbox and of BM25 search, with 1
and 16 concurrent callers, printed as one table.

    python scripts/bench_tools.py [--seconds 3]

Each cell runs calls through ``ToolExecutor`` (``max_workers`` = number of callers) in rounds of
one call per caller for about ``--seconds`` seconds and reports completed calls / wall seconds.
The Python snippet is ``print(1+1)``; the search corpus is the task's own
(``TIRTask(seed=0).corpus()``) and the queries cycle through the fact look-ups of its training
questions ("population of Zorvath").
"""

from __future__ import annotations

import argparse
import itertools
import time

from rllib_arpo.data.tir_task import TIRTask
from rllib_arpo.tools.base import Tool, ToolCall, ToolExecutor
from rllib_arpo.tools.python_runner import namespaces_available
from rllib_arpo.tools.python_sandbox import PythonTool
from rllib_arpo.tools.search import SearchTool

CALLERS = (1, 16)


def calls_per_second(tool: Tool, queries: itertools.cycle, callers: int, seconds: float) -> float:
    """Completed calls per wall-clock second, ``callers`` calls at a time, for about ``seconds``."""
    with ToolExecutor({tool.name: tool}, max_workers=callers, timeout_s=60) as executor:
        executor.run([ToolCall(tool.name, next(queries))])  # warm-up: imports, first probe
        completed, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            results = executor.run([ToolCall(tool.name, next(queries)) for _ in range(callers)])
            assert all(result.ok for result in results), results
            completed += len(results)
        return completed / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per cell")
    args = parser.parse_args()

    task = TIRTask(seed=0)
    fact_queries = [fact.query for example in task.split("train") for fact in example.facts]
    benchmarks = {
        f"python ({'bubblewrap' if namespaces_available() else 'plain subprocess'})": (
            PythonTool(sandbox="best_effort"),
            itertools.cycle(["print(1+1)"]),
        ),
        "search (bm25)": (SearchTool(documents=task.corpus()), itertools.cycle(fact_queries)),
    }
    print(f"{'tool':<28}" + "".join(f"{f'{callers} caller(s)':>16}" for callers in CALLERS))
    for label, (tool, queries) in benchmarks.items():
        rates = [calls_per_second(tool, queries, callers, args.seconds) for callers in CALLERS]
        print(f"{label:<28}" + "".join(f"{f'{rate:.1f} calls/s':>16}" for rate in rates))


if __name__ == "__main__":
    main()
