"""RL on a third-party environment against the best non-RL baseline: reasoning-gym's
``letter_counting`` with SmolLM2-135M-Instruct on this CPU.

1. **Data.** ``recipes/letter_counting/prepare_data.py`` writes train (``--train``), dev
   (``--dev``) and test (``--test``) problems from far-apart generator seeds, no question
   in two splits, once without and once with 3 worked examples before each question.
2. **Baselines on dev**, every one without RL: the model answering zero-shot, the model
   after 3 worked examples (both greedy, through ``agentrl rollout``), and the constant
   answer most frequent among the training problems' answers (counts are small: most
   texts hold the letter once). The best baseline has the highest dev accuracy.
3. **The best baseline on test.**
4. **RL**, once per seed: ``agentrl train recipes/letter_counting/cpu.yaml`` for
   ``--steps`` steps on the few-shot prompts, its last checkpoint exported to Hugging
   Face format and evaluated on test exactly as the prompt baselines were.

Accuracy is reasoning-gym's own score of the answer between ``<answer>`` tags, greedy (one
answer per problem), ± its standard error over problems. A failed episode counts as
wrong.

    .venv/bin/python bench/env_recipe.py [--seeds 0 1 2] [--steps 16]

Models, episodes and logs go to ``--work`` (default ``runs/env-recipe``). Writes
``bench/results/env_recipe.json`` (after every seed): ``environment``, ``baselines`` (dev
accuracy of each), ``best_baseline`` (its name and test accuracy), ``seeds`` (one row per
seed: RL on test, its gain over the best baseline, the gain's SE and minutes),
``min_gain_over_baseline``, ``min_gain_in_se`` (gain over ``√(se_rl² + se_baseline²)``),
``max_minutes`` (the longest seed: training plus its test evaluation) and ``goal_met``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentrl.testing.benchmarks import measured_code, provenance
from agentrl.testing.recipe_bench import (
    clustered_mean,
    export_checkpoint,
    gain,
    rollout_command,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "env_recipe.json"
WORK = ROOT / "runs" / "env-recipe"
RECIPE = ROOT / "recipes" / "letter_counting"
PYTHON = ROOT / ".venv" / "bin" / "python"
AGENTRL = ROOT / ".venv" / "bin" / "agentrl"
MEASURED = measured_code(__file__, sys.argv[1:])
ENVIRONMENT = "reasoning_gym:letter_counting"
BASE_MODEL = "builtin:smollm2-135m-instruct"
SHOTS = 3
GOAL_GAIN = 0.10
GOAL_SE = 4.0
GOAL_MINUTES = 30.0


def run(command: list[str], log: Path) -> None:
    """``command`` from the repository root, its output in ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        done = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"{' '.join(command[:3])}: exited with {done.returncode}; see {log}")


def prepare_data(work: Path, sizes: dict[str, int]) -> dict[str, Path]:
    """The splits, zero-shot (``<split>``) and few-shot (``<split>_fewshot``)."""
    paths = {}
    for shots, suffix in ((0, ""), (SHOTS, "_fewshot")):
        out = work / "data" / f"shots{shots}"
        run(
            [
                str(PYTHON),
                str(RECIPE / "prepare_data.py"),
                "--out-dir",
                str(out),
                "--shots",
                str(shots),
                *(f"--{split}={size}" for split, size in sizes.items()),
            ],
            work / "logs" / f"prepare_data_{shots}.log",
        )
        paths |= {f"{split}{suffix}": out / f"{split}.jsonl" for split in sizes}
    return paths


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def summarize_episodes(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy (the episode's reward: reasoning-gym's score) and the share of answers in
    ``<answer>`` tags (± SE, a problem's answers as one cluster); a failed episode counts
    as wrong, with no answer."""
    accuracy: dict[int, list[float]] = defaultdict(list)
    tagged: dict[int, list[float]] = defaultdict(list)
    for episode in episodes:
        info = episode.get("reward_info") or {}
        score = 0.0 if episode.get("error") else float(episode.get("reward") or 0.0)
        accuracy[episode["row_index"]].append(score)
        tagged[episode["row_index"]].append(float(info.get("answer_found", 0.0)))
    acc, acc_se = clustered_mean(accuracy)
    found, found_se = clustered_mean(tagged)
    return {
        "accuracy": acc,
        "accuracy_se": acc_se,
        "answer_found": found,
        "answer_found_se": found_se,
        "problems": len(accuracy),
        "episodes": len(episodes),
        "failed_episodes": sum(1 for episode in episodes if episode.get("error")),
    }


def evaluate(work: Path, name: str, model: str | Path, split: Path) -> dict[str, Any]:
    """One greedy ``agentrl rollout`` of ``model`` over ``split``: its summary."""
    out = work / "episodes" / f"{name}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    run(
        rollout_command(
            AGENTRL,
            RECIPE / "cpu.yaml",
            split,
            model,
            out,
            "rollout.n=1",
            "rollout.temperature=0",
            f"trainer.run_dir={work / 'rollouts' / name}",
        ),
        work / "logs" / f"{name}.log",
    )
    summary = summarize_episodes(read_rows(out))
    return summary | {"minutes": (time.perf_counter() - started) / 60}


def majority_answer(train: Path) -> str:
    """The most frequent answer among the training problems."""
    answers = Counter(row["reward_model"]["ground_truth"] for row in read_rows(train))
    return answers.most_common(1)[0][0]


def constant_answer(answer: str, split: Path) -> dict[str, Any]:
    """Accuracy of answering ``answer`` to every problem of ``split`` (the recipe's reward
    function scores it)."""
    from agentrl.envs.reasoning_gym import compute_score

    episodes = []
    for index, row in enumerate(read_rows(split)):
        info = compute_score(
            row["data_source"],
            f"<answer>{answer}</answer>",
            row["reward_model"]["ground_truth"],
            row["extra_info"],
        )
        episodes.append({"row_index": index, "reward": info["score"], "reward_info": info})
    return summarize_episodes(episodes) | {"answer": answer}


def baselines_on(work: Path, data: dict[str, Path], split: str, names: list[str]) -> dict:
    """Baselines ``names`` (``zero_shot``, ``few_shot``, ``majority``) on ``split``."""
    results = {}
    for name in names:
        if name == "majority":
            results[name] = constant_answer(majority_answer(data["train"]), data[split])
        else:
            rows = data[split + ("_fewshot" if name == "few_shot" else "")]
            results[name] = evaluate(work, f"{split}_{name}", BASE_MODEL, rows)
    return results


def train_rl(work: Path, seed: int, data: dict[str, Path], steps: int) -> tuple[Path, float]:
    """RL from the base model on the few-shot prompts; the exported policy and minutes."""
    run_dir = work / f"rl-seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    started = time.perf_counter()
    run(
        [
            str(AGENTRL),
            "train",
            str(RECIPE / "cpu.yaml"),
            f"data.train_files=[{data['train_fewshot']}]",
            f"data.val_files=[{data['dev_fewshot']}]",
            f"trainer.total_steps={steps}",
            f"trainer.run_dir={run_dir}",
            f"data.seed={seed}",
            f"workers.actor.seed={seed}",
            f"rollout.seed={seed}",
            f"server.engine.seed={seed}",
        ],
        work / "logs" / f"rl_seed{seed}.log",
    )
    from agentrl.models import resolve_model_path

    policy = run_dir / "policy"
    base = resolve_model_path(BASE_MODEL)
    export_checkpoint(run_dir / "checkpoints" / f"step_{steps}", base, policy)
    return policy, (time.perf_counter() - started) / 60


def seed_row(seed: int, rl: dict, baseline: dict, train_minutes: float) -> dict[str, Any]:
    """One seed: RL on test, its gain over the best baseline, and its minutes."""
    over = gain(rl, baseline)
    return {
        "seed": seed,
        "accuracy": rl["accuracy"],
        "accuracy_se": rl["accuracy_se"],
        "rl": rl,
        "gain": over["gain"],
        "gain_se": over["se"],
        "gain_in_se": over["in_se"],
        "train_minutes": train_minutes,
        "eval_minutes": rl["minutes"],
        "minutes": train_minutes + rl["minutes"],
    }


def write(payload: dict[str, Any]) -> None:
    """The result JSON with its summary keys."""
    rows = payload["seeds"]
    if rows:
        payload |= {
            "min_gain_over_baseline": min(row["gain"] for row in rows),
            "min_gain_in_se": min(row["gain_in_se"] for row in rows),
            "max_minutes": max(row["minutes"] for row in rows),
        }
        payload["goal_met"] = (
            len(rows) >= 3
            and payload["min_gain_over_baseline"] >= GOAL_GAIN
            and payload["min_gain_in_se"] >= GOAL_SE
            and payload["max_minutes"] <= GOAL_MINUTES
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(payload, indent=2))


def report(payload: dict[str, Any]) -> None:
    """Print the dev baselines and the test table."""
    console = Console()

    def cell(result: dict, key: str = "accuracy") -> str:
        return f"{result[key]:.3f} ± {result[f'{key}_se']:.3f}"

    dev = Table(title=f"{ENVIRONMENT}: baselines on dev (no RL)")
    for column in ("baseline", "accuracy", "answer in tags"):
        dev.add_column(column, justify="right")
    for name, result in payload["baselines"].items():
        dev.add_row(name, cell(result), cell(result, "answer_found"))
    console.print(dev)
    test = Table(title="Test set: the best baseline against RL (greedy)")
    for column in ("policy", "accuracy", "gain (in SE)", "answer in tags", "minutes"):
        test.add_column(column, justify="right")
    best = payload["best_baseline"]
    test.add_row(best["name"], cell(best["test"]), "", cell(best["test"], "answer_found"), "")
    for row in payload["seeds"]:
        test.add_row(
            f"RL seed {row['seed']}",
            cell(row["rl"]),
            f"{row['gain']:+.3f} ({row['gain_in_se']:.1f})",
            cell(row["rl"], "answer_found"),
            f"{row['minutes']:.0f}",
        )
    console.print(test)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=16, help="RL steps per seed")
    parser.add_argument("--train", type=int, default=2000, help="training problems")
    parser.add_argument("--dev", type=int, default=256, help="dev problems")
    parser.add_argument("--test", type=int, default=1000, help="test problems")
    parser.add_argument("--work", type=Path, default=WORK, help="models, episodes and logs")
    args = parser.parse_args()
    os.environ.setdefault("AGENTRL_CACHE", str(ROOT / ".cache"))
    payload: dict[str, Any] = {
        "benchmark": "env_recipe",
        **provenance(ROOT, MEASURED),
        "environment": ENVIRONMENT,
        "model": BASE_MODEL,
        "settings": vars(args) | {"work": str(args.work), "shots": SHOTS, "decoding": "greedy"},
        "goal": f"gain >= {GOAL_GAIN} and >= {GOAL_SE} SE over the best non-RL baseline "
        f"in every seed (3 or more), each seed <= {GOAL_MINUTES:.0f} minutes",
        "goal_met": False,
        "seeds": [],
    }
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns) as progress:
        task = progress.add_task("data", total=3 + 2 * len(args.seeds))
        sizes = {"train": args.train, "dev": args.dev, "test": args.test}
        data = prepare_data(args.work, sizes)
        progress.update(task, advance=1, description="baselines on dev")
        payload["baselines"] = baselines_on(
            args.work, data, "dev", ["zero_shot", "few_shot", "majority"]
        )
        best = max(payload["baselines"], key=lambda name: payload["baselines"][name]["accuracy"])
        progress.update(task, advance=1, description=f"{best} on test")
        baseline = baselines_on(args.work, data, "test", [best])[best]
        payload["best_baseline"] = {"name": best, "test": baseline}
        write(payload)
        progress.advance(task)
        for seed in args.seeds:
            progress.update(task, description=f"RL seed {seed}: training")
            policy, minutes = train_rl(args.work, seed, data, args.steps)
            progress.update(task, advance=1, description=f"RL seed {seed}: test")
            rl = evaluate(args.work, f"test_rl_seed{seed}", policy, data["test_fewshot"])
            payload["seeds"].append(seed_row(seed, rl, baseline, minutes))
            write(payload)
            progress.advance(task)
    report(payload)
    Console().print(f"wrote {RESULTS}")


if __name__ == "__main__":
    sys.exit(main())
