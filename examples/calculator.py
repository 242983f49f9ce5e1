"""A calculator tool for multi-turn episodes: the model writes ``<calc>523+312</calc>`` and reads back
``<result>835</result>``; an assistant turn without a calculation is its answer and ends the episode (the reward
functions score that answer). Used by examples/calculator-task.yaml (docs/guides/episodes.md).

Expressions are parsed, never evaluated as code: integers, + - * and parentheses only.
"""

import ast
import operator
import re

_CALL = re.compile(r"<calc>(.*?)</calc>\s*$", re.DOTALL)
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculate(expression: str, max_digits: int) -> int:
    """The value of an integer expression of + - * and parentheses; ValueError for anything else."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            result = _OPERATORS[type(node.op)](value(node.left), value(node.right))
            if len(str(abs(result))) > max_digits:
                raise ValueError("too large")
            return result
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError("not arithmetic")

    if len(expression) > 64:
        raise ValueError("too long")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError("not arithmetic") from err
    return value(tree.body)


class Calculator:
    """reset: a count of calls per episode; step: answer a ``<calc>`` call, or end the episode on an answer."""

    def __init__(self, max_digits: int = 12):
        self.max_digits = max_digits

    def reset(self, row: dict) -> dict:
        return {"calls": 0}

    def step(self, state: dict, assistant_text: str):
        call = _CALL.search(assistant_text)
        if call is None:
            return None, 0.0, True
        state["calls"] += 1
        try:
            result = str(calculate(call.group(1), self.max_digits))
        except ValueError:
            result = "error"
        return f"<result>{result}</result>\n", 0.0, False
