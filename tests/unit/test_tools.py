"""Tools: call parsing, registry, parallel executor, Python sandbox and offline search."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from rllib_arpo.tools import python_sandbox
from rllib_arpo.tools.base import TOOLS, ToolCall, ToolExecutor, build_tools, find_tool_call
from rllib_arpo.tools.python_sandbox import PythonTool
from rllib_arpo.tools.search import NO_RESULTS, SearchTool, split_pages

# the users' data lives beside the repository (../shared/data/arpo); ARPO_DATA_DIR overrides it
DATA_DIR = Path(os.environ.get("ARPO_DATA_DIR", Path(__file__).resolve().parents[3] / "shared/data/arpo"))
SEARCH_CACHE = DATA_DIR / "search_cache" / "search_cache.json"

TOOL_NAMES = ("search", "python")


# --- find_tool_call -----------------------------------------------------------------------


def test_find_tool_call_reads_the_call_that_ends_the_text():
    text = "<think>I need the capital.</think> <search>capital of France</search>"
    assert find_tool_call(text, TOOL_NAMES) == ToolCall("search", "capital of France")


def test_find_tool_call_allows_trailing_whitespace_and_keeps_the_raw_query():
    text = "<python>\n    x = 1\n    print(x)\n</python> \n\t"
    assert find_tool_call(text, TOOL_NAMES) == ToolCall("python", "\n    x = 1\n    print(x)\n")


def test_find_tool_call_takes_the_last_call_of_several():
    text = "<search>first</search> <result>Page 1: a</result> <python>print(2)</python>"
    assert find_tool_call(text, TOOL_NAMES) == ToolCall("python", "print(2)")


def test_find_tool_call_takes_the_last_opening_tag_when_tags_nest():
    text = "<search>outer <search>inner</search>"
    assert find_tool_call(text, TOOL_NAMES) == ToolCall("search", "inner")


@pytest.mark.parametrize(
    "text",
    [
        "no tool call here",
        "<search>query</search> and then more text",  # the closing tag does not end the text
        "<browse>https://example.org</browse>",  # a closing tag of a tool we do not have
        "a query without its opening tag</search>",
        "",
    ],
)
def test_find_tool_call_returns_none_without_a_complete_final_call(text):
    assert find_tool_call(text, TOOL_NAMES) is None


# --- registry -----------------------------------------------------------------------------


def test_build_tools_creates_configured_tools():
    tools = build_tools({"python": {"timeout_s": 5}, "search": {"documents": ["a document"]}})
    assert sorted(tools) == ["python", "search"]
    assert isinstance(tools["python"], PythonTool) and tools["python"].timeout_s == 5
    assert isinstance(tools["search"], SearchTool)
    assert (tools["python"].name, tools["search"].name) == ("python", "search")


def test_build_tools_rejects_an_unknown_tool_and_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown tool 'calculator'; known: browse, python, search"):
        build_tools({"calculator": {}})


def test_build_tools_rejects_bad_arguments():
    with pytest.raises(ValueError, match="bad arguments for tool 'python'.*timeout"):
        build_tools({"python": {"timeout": 5}})


def test_register_tool_sets_the_name_and_refuses_a_second_class_under_it(monkeypatch):
    monkeypatch.setattr(TOOLS, "_entries", dict(TOOLS._entries))

    @TOOLS.register("echo")
    class Echo:
        def __call__(self, query: str) -> str:
            return query

    assert Echo.name == "echo" and TOOLS.get("echo") is Echo
    assert build_tools({"echo": {}})["echo"]("hi") == "hi"
    with pytest.raises(ValueError, match="already registered"):
        TOOLS.register("echo")(type("OtherEcho", (), {}))


# --- executor -----------------------------------------------------------------------------


class SleepTool:
    """Sleeps for the number of seconds given as query and echoes it."""

    name = "sleep"

    def __call__(self, query: str) -> str:
        time.sleep(float(query))
        return query


class BrokenTool:
    name = "broken"

    def __call__(self, query: str) -> str:
        raise RuntimeError("boom")


def test_executor_returns_results_in_input_order():
    calls = [ToolCall("sleep", seconds) for seconds in ("0.3", "0.1", "0.2", "0.0")]
    with ToolExecutor({"sleep": SleepTool()}, max_workers=4) as executor:
        results = executor.run(calls)
    # they finish in the order 0.0, 0.1, 0.2, 0.3, but come back in input order
    assert [result.text for result in results] == ["0.3", "0.1", "0.2", "0.0"]
    assert all(result.ok for result in results)


class MeetingTool:
    """Answers once ``parties`` calls are in it at the same time (a barrier), else breaks."""

    name = "meet"

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties, timeout=60)

    def __call__(self, query: str) -> str:
        return str(self.barrier.wait())


class BlockedTool:
    """Blocks until ``release`` is set; ``returned`` is set once it has answered."""

    name = "blocked"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.returned = threading.Event()

    def __call__(self, query: str) -> str:
        self.release.wait()
        self.returned.set()
        return "released"


def test_executor_runs_the_calls_of_a_round_at_the_same_time():
    with ToolExecutor({"meet": MeetingTool(4)}, max_workers=4, timeout_s=120) as executor:
        results = executor.run([ToolCall("meet", "")] * 4)  # one at a time, the first would wait forever
    assert sorted(result.text for result in results) == ["0", "1", "2", "3"]


def test_executor_answers_a_timeout_with_an_error_text():
    blocked = BlockedTool()
    with ToolExecutor({"blocked": blocked, "sleep": SleepTool()}, timeout_s=0.2) as executor:
        [slow, fast] = executor.run([ToolCall("blocked", ""), ToolCall("sleep", "0")])
        answered_while_blocked = not blocked.returned.is_set()
        blocked.release.set()
    assert (slow.text, slow.ok) == ("Error: blocked timed out after 0.2 s", False)
    assert answered_while_blocked  # the timeout answered: run() did not wait for the blocked tool
    assert (fast.text, fast.ok) == ("0", True)


def test_executor_turns_exceptions_and_unknown_tools_into_error_texts():
    with ToolExecutor({"broken": BrokenTool()}) as executor:
        [broken, unknown] = executor.run([ToolCall("broken", "x"), ToolCall("calculator", "1+1")])
    assert (broken.text, broken.ok) == ("Error: broken failed: RuntimeError: boom", False)
    assert (unknown.text, unknown.ok) == ("Error: unknown tool 'calculator'; available tools: broken", False)


def test_executor_metrics_accumulate_and_reset_on_pop():
    blocked = BlockedTool()
    tools = {"sleep": SleepTool(), "broken": BrokenTool(), "blocked": blocked}
    with ToolExecutor(tools, timeout_s=0.3) as executor:
        first, second, broken = executor.run(
            [ToolCall("sleep", "0.0"), ToolCall("sleep", "0.0"), ToolCall("broken", "x")]
        )
        [timed_out] = executor.run([ToolCall("blocked", "")])
        blocked.release.set()
        metrics = executor.pop_metrics()
        assert executor.pop_metrics() == {}
    assert [metrics[f"tool/sleep/{field}"] for field in ("calls", "failures", "timeouts")] == [2, 0, 0]
    assert [metrics[f"tool/broken/{field}"] for field in ("calls", "failures", "timeouts")] == [1, 1, 0]
    # blocked: 1 call, 1 failure which is the timeout
    assert [metrics[f"tool/blocked/{field}"] for field in ("calls", "failures", "timeouts")] == [1, 1, 1]
    # the mean latency of a tool is the mean of its calls' latencies, a timed-out call's included
    assert metrics["tool/sleep/latency_mean_s"] == pytest.approx((first.latency_s + second.latency_s) / 2)
    assert metrics["tool/broken/latency_mean_s"] == pytest.approx(broken.latency_s)
    assert metrics["tool/blocked/latency_mean_s"] == pytest.approx(timed_out.latency_s)
    assert sorted(metrics) == sorted(
        f"tool/{name}/{field}"
        for name in ("blocked", "broken", "sleep")
        for field in ("calls", "failures", "timeouts", "latency_mean_s")
    )


# --- python sandbox -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def python_tool() -> PythonTool:
    return PythonTool(sandbox="best_effort", timeout_s=5)


def test_python_returns_what_the_code_prints(python_tool):
    assert python_tool("print(1 + 1)") == "2"


def test_python_echoes_the_last_expression_like_the_interpreter(python_tool):
    assert python_tool("3 * 7") == "21"
    assert python_tool("print('a')\nx = 6\nx * 7") == "a\n42"  # 6 * 7 = 42
    assert python_tool("'text'") == "'text'"  # the repr, as the interpreter shows it
    assert python_tool("x = None\nx") == ""  # None is not echoed


def test_python_skips_site_start_up_but_keeps_site_packages_importable(python_tool):
    # no .pth file runs at start-up (-S), yet every site-packages directory is on sys.path
    assert python_tool("import sys\nsys.flags.no_site") == "1"
    code = "import os, site, sys\n[p for p in site.getsitepackages() if os.path.isdir(p) and p not in sys.path]"
    assert python_tool(code) == "[]"
    assert python_tool("print('bye')\nexit(3)") == "bye\nError: the process exited with status 3"  # site's exit()


def test_python_dedents_an_indented_block(python_tool):
    assert python_tool("\n    y = 2\n    y ** 10\n") == "1024"  # 2 ** 10 = 1024


def test_python_reports_a_syntax_error(python_tool):
    lines = python_tool("print(1 +").splitlines()
    assert lines[-1].startswith("SyntaxError:")
    assert "main.py" in python_tool("print(1 +")


def test_python_reports_the_tail_of_a_traceback_after_the_output(python_tool):
    text = python_tool("print('before')\n1 / 0")
    lines = text.splitlines()
    assert lines[0] == "before"
    assert lines[-1] == "ZeroDivisionError: division by zero"
    assert 'File "main.py", line 2, in <module>' in text
    assert "<string>" not in text  # the runner's own frame is hidden


def test_python_kills_an_infinite_loop_at_the_timeout():
    tool = PythonTool(sandbox="best_effort", timeout_s=1)
    assert tool("print('started')\nwhile True:\n    pass") == "started\nError: execution timed out after 1 s"


def test_python_does_not_see_the_parent_environment(python_tool, monkeypatch):
    monkeypatch.setenv("ARPO_TEST_SECRET", "hunter2")
    text = python_tool("import os\nprint(os.environ.get('ARPO_TEST_SECRET'))\nsorted(os.environ)")
    assert text == "None\n['HOME', 'LANG', 'OMP_NUM_THREADS', 'PATH', 'TMPDIR']"


def test_python_runs_in_a_private_directory_that_is_removed(python_tool):
    workdir = python_tool("import os\nopen('scratch.txt', 'w').write('x')\nos.getcwd()").strip("'")
    assert Path(workdir).name.startswith("python-tool-")
    assert not Path(workdir).exists()


def test_python_caps_the_output():
    tool = PythonTool(sandbox="best_effort", timeout_s=5, max_output_chars=10)
    # 10**6 characters printed, 10 kept
    assert tool("print('x' * 10**6)") == "xxxxxxxxxx\n[output truncated to 10 characters]"


def test_python_limits_memory():
    tool = PythonTool(sandbox="best_effort", timeout_s=5, memory_limit_mb=256)
    assert tool("block = bytearray(1 << 30)").splitlines()[-1] == "MemoryError"  # 1 GiB > 256 MiB


# --- search -------------------------------------------------------------------------------

CORPUS = [
    "Paris is the capital of France.",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "The Eiffel Tower is a lattice tower in Paris.",
    "Python is a programming language created by Guido van Rossum.",
]


def test_bm25_ranks_the_matching_document_first_in_the_page_format():
    tool = SearchTool(backend="bm25", documents=CORPUS, top_k=4)
    # "tower" (twice) and "paris" are in document 2, only "paris" in document 0, neither in 1 and 3:
    # both matching documents score > 0 with document 2 on top; the others score 0 and are left out
    assert tool(" tower in Paris ") == (
        "Page 1: The Eiffel Tower is a lattice tower in Paris.\nPage 2: Paris is the capital of France."
    )
    assert tool("who created the Python programming language") == (
        "Page 1: Python is a programming language created by Guido van Rossum."
    )


def test_bm25_respects_top_k_and_cuts_long_results():
    tool = SearchTool(backend="bm25", documents=CORPUS, top_k=1, max_chars_per_result=10)
    assert tool("tower in Paris") == "Page 1: The Eiffel..."  # the first 10 characters, then "..."


def test_bm25_without_a_match_says_so():
    assert SearchTool(documents=CORPUS)("quantum chromodynamics") == NO_RESULTS


def test_bm25_reads_a_jsonl_corpus_with_titles(tmp_path):
    path = tmp_path / "corpus.jsonl"
    records = [{"title": "Eiffel Tower", "text": "A lattice tower\nin Paris."}, {"text": "Plants use light."}]
    path.write_text("\n".join(json.dumps(record) for record in records) + "\n")
    tool = SearchTool(backend="bm25", corpus_path=str(path))
    assert tool("lattice tower") == "Page 1: Eiffel Tower - A lattice tower in Paris."  # newline collapsed
    assert tool("plants") == "Page 1: Plants use light."


def test_search_tool_rejects_bad_configuration():
    with pytest.raises(ValueError, match="unknown search backend 'google'"):
        SearchTool(backend="google", documents=CORPUS)
    with pytest.raises(ValueError, match="exactly one of corpus_path and documents"):
        SearchTool(backend="bm25")


requires_search_cache = pytest.mark.skipif(not SEARCH_CACHE.exists(), reason=f"{SEARCH_CACHE} is missing")


@pytest.fixture(scope="module")
def search_cache() -> dict[str, str]:
    return json.loads(SEARCH_CACHE.read_text())


@pytest.fixture(scope="module")
def cache_tool() -> SearchTool:
    return SearchTool(backend="cache", corpus_path=SEARCH_CACHE)


@requires_search_cache
def test_cache_replays_an_exact_query(cache_tool, search_cache):
    query = "Raymond Blanc OBE works in which city?"
    assert search_cache[query].startswith("Page 1: ")
    assert cache_tool(query) == search_cache[query]
    no_results_query = "molecular formula of ascorbic acid"
    assert search_cache[no_results_query] == NO_RESULTS
    assert cache_tool(no_results_query) == NO_RESULTS


@requires_search_cache
def test_cache_keeps_the_first_top_k_pages(search_cache):
    tool = SearchTool(backend="cache", documents=search_cache, top_k=2)
    query = "Amy Smart film debut Campfire Tales"
    first_two_pages = "\n".join(search_cache[query].split("\n")[:2])
    assert tool(query) == first_two_pages


@requires_search_cache
def test_cache_miss_falls_back_to_bm25_over_the_cached_snippets(cache_tool, search_cache):
    query = "Campfire Tales horror anthology directors"
    assert query not in search_cache
    pages = cache_tool(query).split("\n")
    assert len(pages) == 10  # top_k = 10 by default
    assert [page.split(": ", 1)[0] for page in pages] == [f"Page {rank}" for rank in range(1, 11)]
    assert "Campfire Tales" in pages[0]
    cached_snippets = {snippet for text in search_cache.values() for snippet in split_pages(text)}
    assert all(snippet in cached_snippets for snippet in split_pages("\n".join(pages)))


def test_bm25_index_is_cached_on_disk_and_reused(tmp_path, monkeypatch):
    import bm25s

    documents = [
        "Zorvath is a city. The population of Zorvath is 48213.",
        "Quelmir is a river.",
        "Brask is a mountain.",
    ]
    first = SearchTool(documents=documents, top_k=1, index_cache_dir=tmp_path)
    [index_dir] = [p for p in tmp_path.iterdir() if p.name.startswith("bm25-")]
    built = sorted(p.name for p in index_dir.iterdir())
    monkeypatch.setattr(bm25s.BM25, "index", lambda *a, **k: pytest.fail("the cached index was rebuilt"))
    second = SearchTool(documents=documents, top_k=1, index_cache_dir=tmp_path)  # loads the saved index
    assert second("population of Zorvath") == first("population of Zorvath") == f"Page 1: {documents[0]}"
    assert sorted(p.name for p in index_dir.iterdir()) == built
    monkeypatch.undo()
    SearchTool(documents=documents[:2], top_k=1, index_cache_dir=tmp_path)  # other documents: another index
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("bm25-")]) == 2


def test_the_python_tools_reader_keeps_output_written_as_the_child_exits_during_a_wait(monkeypatch):
    # the child answers and exits while the reader's wait for output comes back empty and before it
    # asks whether the child exited (a busy machine holds the reading thread there): asked after
    # the wait, that exit ended the read with the answer still in the pipe, and the policy read
    # an empty <result></result> (4 of 160 calls with one busy thread beside the reader)
    child = subprocess.Popen(["sh", "-c", "sleep 0.15; echo 337491"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    poll = child.poll

    def poll_after_a_pause():  # the reader descheduled for 0.1 s before it asks
        time.sleep(0.1)
        return poll()

    monkeypatch.setattr(child, "poll", poll_after_a_pause)
    stdout, stderr, timed_out = python_sandbox._read_bounded(child, 8000, time.monotonic() + 5)
    child.wait()
    assert (bytes(stdout), bytes(stderr), timed_out) == (b"337491\n", b"", False)
