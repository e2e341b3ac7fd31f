"""Math answer extraction, normalisation and matching."""

from __future__ import annotations

import pytest

from agentrl.reward import answers_match, compute_score, extract_answer, normalize_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the answer is \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),
        ("first \\boxed{1} then \\boxed{2}", "2"),
        ("\\fbox{7}", "7"),
        ("the answer: \\boxed 9", "9"),
        ("\\boxed{\\text{{nested} braces}}", "\\text{{nested} braces}"),
        ("Natalia sold 48+24 = 72 clips.\n#### 72", "72"),
        ("#### 1,000\nmore text", "1,000"),
        ("I get 3 apples and 4 pears, so 7 in total.", "7"),
        ("a total of $1,234.50 was paid", "1,234.50"),
        ("it is -3.5 degrees", "-3.5"),
        ("half is 3/4 of it", "3/4"),
        ("no digits here", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_unbalanced_boxed_falls_back_to_the_last_number():
    assert extract_answer("so \\boxed{12 + 3") == "3"


def test_require_boxed_ignores_other_numbers():
    assert extract_answer("the result is 5", require_boxed=True) is None
    assert extract_answer("x \\boxed{5}", require_boxed=True) == "5"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("\\boxed{5}", ("5", False)),
        ("$18$", ("18", False)),
        ("\\$18.00", ("18.00", False)),
        ("1,234,567", ("1234567", False)),
        ("50\\%", ("50", True)),
        ("12%", ("12", True)),
        ("\\dfrac{3}{4}", ("3/4", False)),
        ("\\tfrac{3}{4}", ("3/4", False)),
        ("\\frac34", ("3/4", False)),
        ("\\sqrt2", ("\\sqrt{2}", False)),
        ("x = 7", ("7", False)),
        ("90^\\circ", ("90", False)),
        ("90^{\\circ}", ("90", False)),
        ("5 \\text{ cm}", ("5", False)),
        ("5\\mbox{ dollars}", ("5", False)),
        ("9 (apples)", ("9", False)),
        ("15 inches", ("15", False)),
        ("\\text{(B)}", ("b", False)),
        ("\\left( 1, 2 \\right)", ("(1,2)", False)),
        ("\u22123", ("-3", False)),
        ("12.", ("12", False)),
        ("2x", ("2x", False)),
        ("Monday", ("monday", False)),
    ],
)
def test_normalize_answer(answer, expected):
    assert normalize_answer(answer) == expected


@pytest.mark.parametrize(
    ("pred", "truth"),
    [
        ("0.75", "3/4"),
        ("\\frac{3}{4}", "0.75"),
        ("\\dfrac{3}{4}", ".75"),
        ("-\\frac{1}{2}", "-0.5"),
        ("5.0", "5"),
        ("5.00", 5),
        ("39", 39.0),
        ("2.2", 2.1999999999999993),
        ("1,000", "1000"),
        ("$1,000", "1000.0"),
        ("50%", "0.5"),
        ("50\\%", "50"),
        ("0.5", "50%"),
        ("1e3", "1000"),
        ("x=3", "3"),
        ("10 dollars", "10"),
        ("\\text{Monday}", "monday"),
        ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}"),
        ("(1, 2)", "(1,2)"),
        ("A", "(A)"),
        ("7", ["six", "7"]),
        ("\\boxed{4}", "\\boxed{4}"),
    ],
)
def test_equivalent_answers_match(pred, truth):
    assert answers_match(pred, truth)


@pytest.mark.parametrize(
    ("pred", "truth"),
    [
        ("1000000", "1000001"),
        ("0.333", "1/3"),
        ("2x", "2"),
        ("5", "50%"),
        ("12", "21"),
        ("", "0"),
        ("-3", "3"),
        ("7", ["six", "8"]),
        ("tuesday", "monday"),
    ],
)
def test_different_answers_do_not_match(pred, truth):
    assert not answers_match(pred, truth)


def test_compute_score_reports_score_acc_and_prediction():
    assert compute_score("so \\boxed{\\frac{6}{8}}", "0.75") == {
        "score": 1.0,
        "acc": 1.0,
        "pred": "\\frac{6}{8}",
    }
    assert compute_score("I think 12", "13") == {"score": 0.0, "acc": 0.0, "pred": "12"}
    assert compute_score("no idea", "13") == {"score": 0.0, "acc": 0.0, "pred": ""}


def test_compute_score_uses_the_last_boxed_answer_over_later_numbers():
    assert compute_score("\\boxed{8} (checked 3 times)", "8")["score"] == 1.0


def test_compute_score_with_require_boxed_rejects_bare_numbers():
    assert compute_score("answer 8", "8", require_boxed=True)["score"] == 0.0
