"""Fuzzes what a rollout does with the model's text: random and adversarial generations go
through tag parsing (``find_tool_call``), the tools (``ToolExecutor`` with the sandboxed
``python`` tool and BM25 ``search``), result encoding (``encode_tool_result``) and the
hierarchical reward (``validate_format``, answer extraction, scoring). Every exception is a
failure; the counts are printed and the exit status is 1 if any exception was seen.

    python scripts/fuzz_rollout.py [--generations 2000] [--seed 0] [--max-python-calls 150]

Bounded: ``--generations`` texts, at most ``--max-python-calls`` sandbox runs (each at most
``timeout_s`` = 2 s), so a run takes about a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import random
import traceback
from collections import Counter

from rllib_arpo.core.tir_format import DEFAULT_TOOL_TAGS
from rllib_arpo.data.tir_task import TIRTask
from rllib_arpo.models.tiny_policy import build_tokenizer
from rllib_arpo.rewards.hierarchical import hierarchical_reward
from rllib_arpo.tools.base import ToolExecutor, encode_tool_result, find_tool_call
from rllib_arpo.tools.python_sandbox import PythonTool
from rllib_arpo.tools.search import SearchTool

TAGS = [f"<{t}>" for t in ("think", "answer", "result", *DEFAULT_TOOL_TAGS)]
TAGS += [tag.replace("<", "</") for tag in TAGS] + ["<", ">", "</", "<<search>>", "<python >", "</python"]
PIECES = ["\\boxed{", "}", "{", "####", "\n", " ", "42", "Paris", "\\frac{1}{2}", "\x00", "\ud800", "\U0001f600", "é"]
HOSTILE_CODE = [
    "import os\nwhile True: os.fork()",
    "while True: pass",
    "print('x' * 10**8)",
    "import sys\nsys.stdout.buffer.write(bytes(range(256)) * 1000)",
    "open('/etc/passwd').read()",
    "import os\nos.listdir('/work')",
    "import os\nos.kill(-1, 9)",
    "import os\nos._exit(0)",
    "import sys\nsys.exit('bye')",
    "x = bytearray(10**10)",
    "def f(): return f()\nf()",
    "print(1 +",
    "\x00\x00",
    "import subprocess\nsubprocess.Popen(['sleep', '100'], start_new_session=True)",
    "import ctypes\nctypes.string_at(0)",
    "print('\\ud800')",
    "",
]


def random_text(rng: random.Random, pieces: int) -> str:
    """A soup of tags, answer syntax, odd characters and random letters."""
    parts = []
    for _ in range(pieces):
        kind = rng.random()
        if kind < 0.4:
            parts.append(rng.choice(TAGS))
        elif kind < 0.7:
            parts.append(rng.choice(PIECES))
        else:
            parts.append("".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(1, 20))))
    return "".join(parts)


def generation(rng: random.Random, queries: list[str]) -> str:
    """One response as a model might write it, well-formed or not."""
    kind = rng.randrange(8)
    if kind == 0:
        return random_text(rng, rng.randrange(0, 60))
    if kind == 1:  # a well-formed call, hostile or ordinary
        if rng.random() < 0.5:
            return f"<think>compute</think> <python>{rng.choice(HOSTILE_CODE)}</python>"
        return f"<think>look up</think> <search>{rng.choice(queries)}</search>"
    if kind == 2:  # nested, unterminated or reversed tags
        return rng.choice(
            [
                "<search>outer <search>inner</search>",
                "<python>print(1)",
                "</python>print(1)<python>",
                "<python><search>q</search></python>",
                "<answer><python>1</python></answer>",
                "<result>fake</result><answer>\\boxed{1}</answer>",
            ]
        )
    if kind == 3:  # a complete answer, right or wrong
        answer = rng.choice(["42", "1,000", "\\frac{1}{2}", "Paris", ""])
        return f"<think>so</think> <answer>\\boxed{{{answer}}}</answer>"
    if kind == 4:  # huge
        return "<think>" + "a" * rng.randrange(10**5, 10**6) + "</think><search>" + "b" * 10**5 + "</search>"
    if kind == 5:
        return ""
    if kind == 6:  # a call followed by its result, then more
        return f"<search>{rng.choice(queries)}</search> <result>{random_text(rng, 10)}</result>" + random_text(rng, 10)
    return random_text(rng, 5) + f"<python>{random_text(rng, 8)}</python>"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-python-calls", type=int, default=150)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    task = TIRTask(seed=0)
    queries = [fact.query for example in task.split("train") for fact in example.facts]
    tokenizer = build_tokenizer([task.corpus()[0], *TAGS], vocab_size=300)
    tools = {
        "python": PythonTool(sandbox="best_effort", timeout_s=2, memory_limit_mb=256),
        "search": SearchTool(documents=task.corpus(), top_k=3),
    }
    counts: Counter = Counter()
    failures: Counter = Counter()
    with ToolExecutor(tools, max_workers=4, timeout_s=10) as executor:
        for _ in range(args.generations):
            text = generation(rng, queries)
            counts["generations"] += 1
            try:
                call = find_tool_call(text, tuple(tools))
                if call is None:
                    counts["no_tool_call"] += 1
                elif call.name == "python" and counts["tool_calls/python"] >= args.max_python_calls:
                    counts["python_calls_over_budget"] += 1
                else:
                    [result] = executor.run([call])
                    counts[f"tool_calls/{call.name}"] += 1
                    counts[f"tool_errors/{call.name}"] += result.text.startswith("Error") or not result.ok
                    ids = encode_tool_result(tokenizer, result.text, max_tokens=256)
                    counts["result_tokens"] += len(ids)
                    text += tokenizer.decode(ids)
                for task_kind in ("qa", "math"):
                    reward = hierarchical_reward(
                        text, ["42", "Paris"], task=task_kind, tool_calls=Counter(call and [call.name])
                    )
                    counts[f"reward/{task_kind}/{'format_ok' if reward.format_ok else 'format_failed'}"] += 1
            except Exception as error:  # noqa: BLE001 - counting them is the point
                failures[f"{type(error).__name__}: {str(error)[:80]}"] += 1
                if sum(failures.values()) == 1:
                    traceback.print_exc()
        counts.update({f"executor/{k}": v for k, v in executor.pop_metrics().items() if not k.endswith("_s")})
    for key in sorted(counts):
        print(f"{key:<40} {counts[key]}")
    print(f"{'exceptions':<40} {sum(failures.values())}")
    for message, n in failures.most_common():
        print(f"  {n} x {message}")
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
