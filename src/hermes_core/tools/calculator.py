"""A safe arithmetic evaluator: the logic behind the example `calculator` tool.

The model sends text it wrote itself, possibly copied from a hostile user, so nothing here ever
calls `eval`, `exec` or `compile` on it. The text is parsed with `ast.parse(..., mode="eval")` and
the tree is walked against an explicit whitelist: numbers, `+ - * / // % **`, unary `+`/`-`, the
constants `pi`, `e`, `tau` and calls of a few named math functions. Anything else is rejected
with a `CalculatorError` whose message is meant to be read by the model, so it can fix its input.

Every limit exists because some input would otherwise hang or exhaust the process: `9**9**9**9`
is a valid Python expression whose value does not fit in the universe, so exponents are checked
*before* they are computed, and every intermediate result is bounded in size.

Number results: arithmetic on ints stays an int (`(12+34)*2` → `92`). True division of ints
that divides evenly also stays an int (`4/2` → `2`, `10**30/10` exact); otherwise it is a float
(`7/2` → `3.5`). Anything involving a float, or a float-valued function such as `sqrt`, is a
float (`sqrt(16)` → `4.0`).

Numbers with a leading zero (`007`, the `01` of `2025-01-01`) are refused with a message saying
so, and pointing at date_diff when the text looks like a date, instead of Python's octal hint.

Thousands separators are not supported: `1,000` would be ambiguous with the comma between the
arguments of `max(1,000)`, so a comma outside a function call is rejected with a hint.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable
from typing import Any

Number = int | float

MAX_LENGTH = 500
MAX_DEPTH = 50
MAX_EXPONENT = 10_000
MAX_DIGITS = 10_000
MAX_FACTORIAL = 1_000

_INT_LIMIT = 10**MAX_DIGITS  # the smallest int with more than MAX_DIGITS digits


class CalculatorError(ValueError):
    """The expression is not allowed, not valid, or its value cannot be computed safely."""


def _factorial(n: Number) -> int:
    if not isinstance(n, int):
        raise CalculatorError("factorial() needs a whole number, e.g. factorial(5)")
    if n < 0 or n > MAX_FACTORIAL:
        raise CalculatorError(f"factorial() is limited to 0..{MAX_FACTORIAL}, got {n}")
    return math.factorial(n)


def _round(x: Number, ndigits: Number | None = None) -> Number:
    if ndigits is None:
        return round(x)
    if not isinstance(ndigits, int):
        raise CalculatorError("round() needs a whole number of digits, e.g. round(3.14159, 2)")
    if abs(ndigits) > MAX_DIGITS:  # round(5, -10**9) would compute 10**(10**9)
        raise CalculatorError(f"round() digits must be between -{MAX_DIGITS} and {MAX_DIGITS}")
    return round(x, ndigits)


def _min(*values: Number) -> Number:
    if not values:
        raise CalculatorError("min() needs at least one number")
    return min(values)


def _max(*values: Number) -> Number:
    if not values:
        raise CalculatorError("max() needs at least one number")
    return max(values)


FUNCTIONS: dict[str, Callable[..., Number]] = {
    "sqrt": math.sqrt,
    "abs": abs,
    "round": _round,
    "min": _min,
    "max": _max,
    "log": math.log,
    "log10": math.log10,
    "log2": math.log2,
    "exp": math.exp,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "floor": math.floor,
    "ceil": math.ceil,
    "factorial": _factorial,
}

CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}

_BINARY_OPERATORS: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: _divide(a, b),
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: _power(a, b),
}

# Full-width forms (U+FF01..U+FF5E) map onto ASCII by a fixed offset; this covers （）＋－＊／％＾,
# the digits ０-９ and letters such as ｓｑｒｔ. NFKC is deliberately not used: it turns "3²" into "32".
_NORMALISE: dict[int, int | str] = {code: code - 0xFEE0 for code in range(0xFF01, 0xFF5F)}
_NORMALISE.update({ord("×"): "*", ord("÷"): "/", ord("−"): "-", ord("\u3000"): " "})


def evaluate(expression: str) -> int | float:
    """Evaluate an arithmetic expression such as `(12+34)*2`, `3^2` or `sqrt(2)/2`.

    Raises `CalculatorError` (a `ValueError`) for anything outside the whitelist or the limits;
    no other exception escapes, whatever the input.
    """
    text = normalise(expression)
    _check_leading_zeros(text)
    _check_parentheses(text)
    tree = _parse(text)
    _check_depth(tree)
    try:
        return _evaluate(tree.body)
    except CalculatorError:
        raise
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("the result is too large to compute") from None
    except (ValueError, TypeError) as exc:  # math domain errors, wrong argument counts
        raise CalculatorError(f"cannot compute this: {exc}") from None
    except RecursionError:  # cannot happen below MAX_DEPTH, kept as a last line of defence
        raise CalculatorError("the expression is nested too deeply") from None


def normalise(expression: str) -> str:
    """Map full-width characters, `×`, `÷` and `^` to Python syntax; drop a trailing `=`."""
    if not isinstance(expression, str):
        raise CalculatorError(f"the expression must be text, got {type(expression).__name__}")
    if len(expression) > MAX_LENGTH:
        raise CalculatorError(f"the expression is too long ({len(expression)} > {MAX_LENGTH} characters)")
    text = expression.translate(_NORMALISE).replace("^", "**").strip().removesuffix("=").strip()
    if not text:
        raise CalculatorError("the expression is empty")
    return text


def format_result(value: int | float) -> str:
    """The decimal text of a result, without tripping Python's int-to-str digit limit.

    Python 3.11+ refuses `str()` of ints above 4,300 digits by default; results here may have up
    to 10,000, so large ints are converted in chunks instead of changing the global limit.
    """
    if isinstance(value, float) or abs(value) < 10**3000:
        return str(value)
    sign = "-" if value < 0 else ""
    high, low = divmod(abs(value), 10**3000)
    return sign + format_result(high) + str(low).zfill(3000)


_LEADING_ZERO = re.compile(r"(?<![\w.])(?<!\d,)0\d+(?![.\w])")  # not 0.5, 1.05, 1e05 or 007.5 (a float)
_DATE = re.compile(r"\b\d{4}-\d{1,2}-\d{1,2}\b")


def _check_leading_zeros(text: str) -> None:
    """Refuse `01`-style integers (Python reads them as a syntax error about octal literals)."""
    date = _DATE.search(text)
    if date:
        raise CalculatorError(
            f"{date.group()} looks like a date, not arithmetic: use the date_diff tool for the days "
            "between two dates or the weekday of a date"
        )
    found = _LEADING_ZERO.search(text)
    if found:
        number = found.group()
        raise CalculatorError(
            f"numbers cannot start with 0: write {number.lstrip('0') or '0'} instead of {number}"
        )


def _check_parentheses(text: str) -> None:
    """Refuse deep parentheses before the parser sees them: `((((1))))` leaves no trace in the tree."""
    depth = 0
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth > MAX_DEPTH:
            raise CalculatorError(f"the expression is nested too deeply (more than {MAX_DEPTH} parentheses)")


def _parse(text: str) -> ast.Expression:
    try:
        return ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not a valid arithmetic expression: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError):  # null bytes, lone surrogates, deep nesting
        raise CalculatorError("not a valid arithmetic expression") from None


def _check_depth(tree: ast.AST) -> None:
    """Measure nesting with an explicit stack, so measuring cannot itself hit the recursion limit."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise CalculatorError(f"the expression is nested too deeply (more than {MAX_DEPTH} levels)")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _evaluate(node: ast.AST) -> Number:
    value = _evaluate_node(node)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CalculatorError("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is too large or undefined (overflow or NaN)")
    if isinstance(value, int) and abs(value) >= _INT_LIMIT:
        raise CalculatorError(f"the result has more than {MAX_DIGITS} digits")
    return value


def _evaluate_node(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant):
        if type(node.value) in (int, float):
            return node.value
        raise CalculatorError(f"only numbers are allowed, got {node.value!r}")
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPERATORS:
        return _BINARY_OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        operand = _evaluate(node.operand)
        return -operand if isinstance(node.op, ast.USub) else +operand
    if isinstance(node, ast.Name):
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if node.id in FUNCTIONS:
            raise CalculatorError(f"{node.id} is a function; call it like {node.id}(2)")
        raise CalculatorError(f"unknown name {node.id!r}; allowed constants are {', '.join(CONSTANTS)}")
    if isinstance(node, ast.Call):
        return _call(node)
    if isinstance(node, ast.Tuple):
        raise CalculatorError("commas are only allowed between function arguments; write 1000, not 1,000")
    if isinstance(node, ast.Attribute):
        raise CalculatorError("attribute access is not allowed")
    raise CalculatorError(f"unsupported syntax: {type(node).__name__}")


def _call(node: ast.Call) -> Number:
    if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
        raise CalculatorError(f"only these functions can be called: {', '.join(FUNCTIONS)}")
    name = node.func.id
    if node.keywords or any(isinstance(arg, ast.Starred) for arg in node.args):
        raise CalculatorError(f"{name}() takes plain positional arguments only")
    args = [_evaluate(arg) for arg in node.args]
    try:
        return FUNCTIONS[name](*args)
    except CalculatorError:
        raise
    except TypeError:
        raise CalculatorError(f"wrong number or kind of arguments for {name}()") from None
    except ValueError as exc:  # math domain errors such as sqrt(-1) or log(0)
        raise CalculatorError(f"{name}() is not defined for these arguments ({exc})") from None


def _divide(a: Number, b: Number) -> Number:
    if isinstance(a, int) and isinstance(b, int) and b != 0 and a % b == 0:
        return a // b  # exact, and avoids float rounding of large ints
    return a / b


def _power(base: Number, exponent: Number) -> Number:
    """Refuse powers whose size is known to be absurd before spending any time computing them."""
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"the exponent {_short(exponent)} is too large (limit {MAX_EXPONENT})")
    if exponent > 0 and abs(base) > 1:
        digits = exponent * math.log10(abs(base))
        if digits > MAX_DIGITS + 1:
            raise CalculatorError(f"the result would have about {digits:.0f} digits (limit {MAX_DIGITS})")
    return base**exponent


def _short(value: Number) -> str:
    """A number for an error message: huge ints are summarised instead of printed in full."""
    if isinstance(value, int) and abs(value) >= 10**30:
        return f"with {len(format_result(abs(value)))} digits"
    return str(value)
