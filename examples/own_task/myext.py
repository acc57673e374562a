"""A task of your own: numeric questions, each with its own tolerance, and a calculator tool.

Imported by ``imports: [myext.py]`` in own_task.yaml, in the driver and in every Ray worker:
the decorators register the dataset type and the tool under the names the YAML uses, and the
reward is named by its import path, ``myext:score``.
"""

import ast
import json
import operator
from pathlib import Path

from rllib_arpo.core.answers import extract_answer
from rllib_arpo.data.examples import PromptExample
from rllib_arpo.data.prompts import tir_messages
from rllib_arpo.data.registry import DATASET_LOADERS
from rllib_arpo.tools.base import TOOLS

SYSTEM_PROMPT = (
    "Answer the question step by step. To compute, write an expression inside <calculator> </calculator>; "
    "its value comes back inside <result> </result>. Give the final answer as <answer> \\boxed{...} </answer>."
)


@DATASET_LOADERS.register("numeric_qa")
def load_numeric_qa(path: str, limit: int | None = None) -> list[PromptExample]:
    """One JSON object a line: `question`, `answer` (a number) and `tolerance` (how far from it
    an answer may be); `tolerance` reaches the reward as a column of the row."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [
        PromptExample(
            prompt=tir_messages(row["question"], SYSTEM_PROMPT),
            ground_truth=str(row["answer"]),
            task="math",
            source="numeric_qa",
            extra={"tolerance": row["tolerance"]},
        )
        for row in rows[:limit]
    ]


def score(response: str, row: dict, *, right: float = 1.0, wrong: float = 0.0, **_) -> dict:
    """`right` for a final answer within the row's tolerance of its ground truth, else `wrong`;
    `correct` (1 or 0) makes the accuracy metrics."""
    tolerance = float(row["tolerance"])
    try:
        correct = abs(float(extract_answer(response)) - float(row["ground_truth"])) <= tolerance
    except (TypeError, ValueError):  # no final answer, or not a number
        correct = False
    return {"reward": right if correct else wrong, "correct": float(correct)}


OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}


@TOOLS.register("calculator")
class Calculator:
    """`<calculator>12 * (3 + 4)</calculator>` -> `84`: numbers, + - * / and brackets."""

    def __init__(self, *, digits: int = 6):
        self.digits = digits

    def __call__(self, query: str) -> str:
        return str(round(self.evaluate(ast.parse(query, mode="eval").body), self.digits))

    def evaluate(self, node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](self.evaluate(node.left), self.evaluate(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](self.evaluate(node.operand))
        raise ValueError("only numbers, + - * / and brackets")
