"""``calculator``: safe arithmetic, evaluated by walking the ``ast`` (never ``eval``).

Numbers, ``+ - * / // % **``, unary signs, parentheses, the constants ``pi``
and ``e`` and a few ``math`` functions. Integers are exact but bounded (see
``MAX_INT_BITS``), so ``9**9**9`` is refused before any work is done.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from agentrl.tools.base import BaseTool, ToolResponse
from agentrl.tools.schema import OpenAIFunctionToolSchema

__all__ = ["MAX_EXPRESSION_CHARS", "MAX_INT_BITS", "CalculatorError", "CalculatorTool", "evaluate"]

MAX_EXPRESSION_CHARS = 1000
MAX_INT_BITS = 4096
"""Largest integer (in bits) any step may produce: about 1233 decimal digits."""
_MAX_FACTORIAL = 500

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_CONSTANTS = {"pi": math.pi, "e": math.e}


def _factorial(n: Number) -> int:
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    if not isinstance(n, int) or n < 0:
        raise CalculatorError(f"factorial needs a non-negative integer, got {n!r}")
    if n > _MAX_FACTORIAL:
        raise CalculatorError(f"factorial({n}) is too large (limit {_MAX_FACTORIAL})")
    return math.factorial(n)


_FUNCTIONS: dict[str, Callable[..., Number]] = {
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
    "exp": math.exp,
    "log": math.log,
    "log2": math.log2,
    "log10": math.log10,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "asin": math.asin,
    "acos": math.acos,
    "atan": math.atan,
    "floor": math.floor,
    "ceil": math.ceil,
    "factorial": _factorial,
}


class CalculatorError(ValueError):
    """The expression is not allowed or cannot be evaluated; the message says why."""


def evaluate(expression: str) -> Number:
    """Evaluate an arithmetic expression safely.

    Raises:
        CalculatorError: for syntax outside the allowed subset, division by
            zero, math domain errors, or results beyond the size limits.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(
            f"expression is {len(expression)} characters long; the limit is {MAX_EXPRESSION_CHARS}"
        )
    try:
        return _eval(ast.parse(expression.strip(), mode="eval").body)
    except SyntaxError as exc:
        raise CalculatorError(f"invalid expression {expression!r}: {exc.msg}") from None
    except ZeroDivisionError:
        raise CalculatorError(f"division by zero in {expression!r}") from None
    except OverflowError:
        raise CalculatorError(f"result of {expression!r} is too large for a float") from None
    except (RecursionError, MemoryError):
        raise CalculatorError("expression is nested too deeply") from None


def _eval(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise CalculatorError(f"only numbers are allowed, got {node.value!r}")
        return _check(node.value)
    if isinstance(node, ast.BinOp):
        op = _BINARY.get(type(node.op))
        if op is None:
            hint = " (use ** for powers)" if isinstance(node.op, ast.BitXor) else ""
            raise CalculatorError(f"operator {ast.unparse(node)!r} is not allowed{hint}")
        left, right = _eval(node.left), _eval(node.right)
        if op is operator.pow:
            _check_power(left, right)
        return _check(op(left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.Name):
        if node.id not in _CONSTANTS:
            raise CalculatorError(f"unknown name {node.id!r}; the constants are pi and e")
        return _CONSTANTS[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        func = _FUNCTIONS.get(node.func.id)
        if func is None or node.keywords:
            allowed = ", ".join(sorted(_FUNCTIONS))
            raise CalculatorError(f"unknown function {node.func.id!r}; allowed: {allowed}")
        args = [_eval(arg) for arg in node.args]
        try:
            return _check(func(*args))
        except (TypeError, ValueError) as exc:
            if isinstance(exc, CalculatorError):
                raise
            raise CalculatorError(f"{ast.unparse(node)}: {exc}") from None
    raise CalculatorError(f"{ast.unparse(node)!r} is not allowed in an arithmetic expression")


def _check_power(base: Number, exponent: Number) -> None:
    if isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1 and exponent > 0:
        bits = exponent * math.log2(abs(base))
        if bits > MAX_INT_BITS:
            raise CalculatorError(
                f"{base}**{exponent} would have about {bits:.3g} bits; the limit is {MAX_INT_BITS}"
            )


def _check(value: Any) -> Number:
    if isinstance(value, complex):
        raise CalculatorError("the result is a complex number, which is not supported")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError(f"the result is not a finite number ({value})")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise CalculatorError(f"an intermediate result exceeds {MAX_INT_BITS} bits")
    return value


class CalculatorTool(BaseTool):
    """A tool that evaluates one arithmetic expression; errors are returned as text."""

    @classmethod
    def default_tool_schema(cls) -> OpenAIFunctionToolSchema:
        """``calculator(expression: str)``."""
        return OpenAIFunctionToolSchema.model_validate(
            {
                "type": "function",
                "function": {
                    "name": "calculator",
                    "description": (
                        "Evaluate an arithmetic expression. Supports + - * / // % **, "
                        "parentheses, pi, e and the functions "
                        + ", ".join(sorted(_FUNCTIONS))
                        + "."
                    ),
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "expression": {
                                "type": "string",
                                "description": "The expression, e.g. '(3 + 4) * 2 ** 10'.",
                            }
                        },
                        "required": ["expression"],
                    },
                },
            }
        )

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Evaluate ``parameters["expression"]``; a bad expression yields an ``Error: ...`` text."""
        try:
            result = evaluate(str(parameters["expression"]))
        except CalculatorError as exc:
            return ToolResponse(text=f"Error: {exc}"), 0.0, {"ok": False}
        return ToolResponse(text=repr(result)), 0.0, {"ok": True}
