"""The ``python_session`` environment: a Python session whose variables persist between calls.

The policy writes ``<python>code</python>`` as it does for the ``python`` tool, and the session
answers with what the code printed, the value of its last expression or its traceback, exactly
as that tool does (``tools.python_sandbox``: the same sandbox and limits, ``PythonTool``'s own
options, but ``sandbox`` must be ``required``: see below). What differs is that a *cell* sees
everything the earlier cells of its trajectory defined, as in an interactive interpreter::

    stateful_env: {name: python_session, timeout_s: 10, setup_column: setup}

``reset(row)`` starts with the row's ``setup`` column (code the task defines, such as
``values = [3, 8, 1]``) as the first cell, shown to nobody; the first observation is empty.

The state is the code itself, not a live interpreter: each step starts one fresh sandboxed
interpreter that first re-runs every earlier cell with its output discarded and any exception
(``SystemExit`` included) swallowed, so a cell that failed half way keeps what it did before
the error, then runs the new cell. So:

- step n costs n cells, and the time and memory limits cover the replay and the new cell
  together; a cell that does not finish (stopped at the timeout or by a signal) or that ends
  the interpreter itself (``os._exit``, whatever its status) is not kept, so the session goes on
  as it was before it (kept, it would end every later step's replay before its new cell);
- every step runs every earlier cell again, so a cell's effects outside its interpreter happen
  once per later step: the session runs only in the isolated sandbox (``sandbox: required``,
  the default), where those effects stay in the call's private ``/tmp``; ``best_effort``, which
  may fall back to running on this machine, and ``off`` are refused when the session is built;
- ``clone()`` copies a list of strings; files a cell writes (in its private ``/tmp``) come back
  only because the replay writes them again;
- ``random`` is seeded with 0 before the replay, so the values a session draws from it are
  those of one stream seeded when the episode started, the same in every replay and copy: the
  session is ``deterministic``. What the cells read from outside is not: the time,
  ``os.urandom`` (``secrets``, ``uuid4``), numpy's unseeded generator, the process id, the
  order of a set of strings (hash randomisation). A value computed from those in an earlier
  cell is computed again at every step;
- the replay is one line before the new cell, so a traceback's line numbers in the new cell
  count one more than the cell's own (``main.py``, line 2 is the cell's first line); a frame of
  an earlier cell's code is named ``<cell k>``, without its source line. For the same reason
  the new cell may not start with ``from __future__ import ...`` (a ``SyntaxError``).
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Mapping
from typing import Any

from rllib_arpo.environments.base import ENVIRONMENTS
from rllib_arpo.tools.python_sandbox import PythonTool

_REPLAY = """\
import os, random
from os import close, dup2
random.seed(0)
quiet = os.open(os.devnull, os.O_WRONLY)
out, err = os.dup(1), os.dup(2)
dup2(quiet, 1)
dup2(quiet, 2)
run = exec
for number, cell in enumerate(cells, 1):
    try:
        run(compile(cell, f"<cell {number}>", "exec"), namespace)
    except BaseException:
        pass
dup2(out, 1)
dup2(err, 2)
close(out)
close(err)
close(quiet)
"""
"""Runs in the sandbox before the new cell, in a namespace of its own (so it leaves no names in
the session's): seeds ``random``, then runs ``cells`` in the session's ``namespace`` with
stdout and stderr pointed at ``/dev/null`` at the file-descriptor level (which also silences
``os.write`` and child processes), each cell's exceptions swallowed. It holds ``exec``,
``os.dup2`` and ``os.close`` in names of its own, so a cell that rebinds them does not break the
replay of the cells after it."""


@ENVIRONMENTS.register("python_session")
class PythonSession:
    """A Python session for one trajectory (module docstring).

    Args:
        setup_column: the row's column that holds the session's setup code (a row without it,
            or with an empty one, starts empty).
        **tool_options: ``PythonTool``'s options (``timeout_s``, ``memory_limit_mb``, ...),
            checked here and used when the first cell runs; ``sandbox`` must be ``required``
            (module docstring).
    """

    action_tag = "python"
    deterministic = True

    def __init__(self, setup_column: str = "setup", **tool_options: Any) -> None:
        try:
            options = inspect.signature(PythonTool).bind(**tool_options)
        except TypeError as error:
            raise ValueError(f"python_session: {error}") from None
        options.apply_defaults()
        if options.arguments["sandbox"] != "required":
            raise ValueError(
                f"python_session: sandbox must be 'required', got {options.arguments['sandbox']!r}: every step runs "
                "the earlier cells again, which only the isolated sandbox keeps off this machine"
            )
        self.setup_column = setup_column
        self.tool_options = tool_options
        self.cells: list[str] = []
        self._tool: PythonTool | None = None

    @property
    def tool(self) -> PythonTool:
        """The sandboxed interpreter, built when first needed: building it probes the sandbox,
        which a config check (that builds one instance) should not pay for."""
        if self._tool is None:
            self._tool = PythonTool(**self.tool_options)
        return self._tool

    def reset(self, row: Mapping[str, Any]) -> str:
        setup = row.get(self.setup_column)
        self.cells = [textwrap.dedent(setup)] if isinstance(setup, str) and setup else []
        return ""

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        cell = textwrap.dedent(action)  # as the python tool dedents its code
        observation, finished = self.tool.run(self.program(cell))
        if finished:
            self.cells.append(cell)
        return observation, 0.0, False, {}

    def program(self, cell: str) -> str:
        """What the sandbox runs for ``cell``: one line that replays the earlier cells (``_REPLAY``), then the cell."""
        return f"exec({_REPLAY!r}, {{'cells': {self.cells!r}, 'namespace': globals()}})\n{cell}"

    def clone(self) -> PythonSession:
        """A session in this one's state that goes on alone; it shares the (stateless) interpreter."""
        twin = PythonSession(self.setup_column, **self.tool_options)
        twin._tool = self.tool
        twin.cells = list(self.cells)
        return twin
