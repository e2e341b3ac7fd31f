r"""Rule-based math answer checking: extract the model's answer, normalise, compare.

Extraction takes the last ``\boxed{...}`` (nested braces allowed; ``\fbox`` too), else a
GSM8K-style ``#### answer``, else the last number in the text. Normalisation strips ``$``,
``\text{}`` wrappers, units after a number, degree signs, ``\left``/``\right``, spacing
commands and a leading ``x =``; turns ``\dfrac``/``\tfrac``/``\frac12`` into ``a/b``,
removes thousands separators, and records a percent sign. Two answers match when both parse
as numbers that are equal (exactly as fractions, or within 1e-9 relative; ``50%`` also
matches ``0.5``), or else when their normalised strings are equal.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

__all__ = [
    "answers_match",
    "compute_score",
    "extract_answer",
    "last_boxed",
    "normalize_answer",
    "parse_number",
]

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_TEXT_WRAPPERS = re.compile(
    r"\\(?:text|textbf|textit|mbox|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}"
)
_FRAC = re.compile(r"(?<!\d)\\frac\{([^{}]+)\}\{([^{}]+)\}")
_FRAC_SHORT = re.compile(r"\\frac\s*(\d)\s*(\d)")
_SQRT_SHORT = re.compile(r"\\sqrt\s*(\d+)")
_LHS = re.compile(r"^[a-zA-Z]\w*\s*=\s*(?=\S)")
_NUMBER_WITH_UNIT = re.compile(
    r"^([-+]?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:/\d+)?)(?:\s*\(.*\)|\s+[a-zA-Z][a-zA-Z\s.^\d]*)$"
)
_SPACING = ("\\left", "\\right", "\\displaystyle", "\\!", "\\,", "\\;", "\\:", "\\ ", "~")
_DEGREES = ("^{\\circ}", "^\\circ", "\\circ", "°", "\\degree")


def _braced(text: str, i: int) -> tuple[str, int] | None:
    """Content of the brace group opening at ``text[i]`` and the index of its closing brace."""
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j], j
    return None


def last_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}``/``\fbox{...}`` (or ``\boxed 5``); None if absent
    or unbalanced."""
    start, command = max((text.rfind(c), c) for c in _BOX_COMMANDS)
    if start < 0:
        return None
    i = start + len(command)
    if text[i : i + 1] == " ":
        match = re.match(r" +([^\s$]+)", text[i:])
        return match.group(1) if match else None
    group = _braced(text, i)
    return group[0] if group else None


def extract_answer(text: str, *, require_boxed: bool = False) -> str | None:
    r"""The answer a response gives: last ``\boxed{}``, else ``#### x``, else the last
    number (only the boxed one when ``require_boxed``); None when there is none."""
    boxed = last_boxed(text)
    if boxed is not None or require_boxed:
        return boxed
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip().splitlines()
        if tail and tail[0].strip():
            return tail[0].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _unwrap_boxed(s: str) -> str:
    """Strip ``\\boxed{...}`` wrappers that span the whole string."""
    s = s.strip()
    for command in _BOX_COMMANDS:
        if s.startswith(command):
            group = _braced(s, len(command))
            if group and group[1] == len(s) - 1:
                return _unwrap_boxed(group[0])
    return s


def normalize_answer(answer: Any) -> tuple[str, bool]:
    """Canonical string form of ``answer`` and whether it carried a percent sign."""
    s = _unwrap_boxed(str(answer)).replace("\u2212", "-")
    for token in _SPACING:
        s = s.replace(token, " ")
    for token in _DEGREES:
        s = s.replace(token, "")
    while _TEXT_WRAPPERS.search(s):
        s = _TEXT_WRAPPERS.sub(r" \1 ", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("\\$", "").replace("$", "")
    percent = "%" in s
    s = s.replace("\\%", "").replace("%", "")
    s = s.strip().rstrip(".").strip()
    s = _LHS.sub("", s)
    s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
    s = _SQRT_SHORT.sub(r"\\sqrt{\1}", s)
    s = _FRAC.sub(r"\1/\2", s)
    s = s.strip()
    unit = _NUMBER_WITH_UNIT.match(s)
    if unit:
        s = unit.group(1)
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    s = re.sub(r"\s+", "", s).lower()
    if re.fullmatch(r"\([a-z]\)", s):
        s = s[1]
    return s, percent


def parse_number(s: str) -> Fraction | None:
    """``s`` as an exact fraction (ints, decimals, ``a/b``, ``1e3``); None if not a number."""
    try:
        value = Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    return value


def _numbers_equal(a: Fraction, b: Fraction) -> bool:
    return a == b or math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)


def answers_match(pred: Any, ground_truth: Any) -> bool:
    """True when ``pred`` equals ``ground_truth`` (or any of a list of ground truths) after
    normalisation."""
    if isinstance(ground_truth, list | tuple):
        return any(answers_match(pred, gt) for gt in ground_truth)
    p, p_percent = normalize_answer(pred)
    g, g_percent = normalize_answer(ground_truth)
    if not p:
        return False
    pn, gn = parse_number(p), parse_number(g)
    if pn is not None and gn is not None:
        return (
            _numbers_equal(pn, gn)
            or (p_percent and _numbers_equal(pn / 100, gn))
            or (g_percent and _numbers_equal(pn, gn / 100))
        )
    return p == g


def compute_score(
    solution_str: str, ground_truth: Any, *, require_boxed: bool = False
) -> dict[str, Any]:
    """Score a response: ``{"score": 1.0 or 0.0, "acc": same, "pred": extracted answer}``.

    With ``require_boxed`` only a ``\\boxed{}`` answer counts (no final-number fallback).
    """
    pred = extract_answer(solution_str, require_boxed=require_boxed)
    correct = pred is not None and answers_match(pred, ground_truth)
    value = 1.0 if correct else 0.0
    return {"score": value, "acc": value, "pred": pred or ""}
