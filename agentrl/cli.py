"""The ``agentrl`` command line.

Help, ``--version``, ``agentrl config`` and every error in a config or its inputs answer
without loading torch, Ray, vLLM or transformers: this module imports only the config
help at start, and each verb imports what it runs only after its config validated and
its inputs were checked (``agentrl.preflight``). An error in what the user gave (a config
key or value, a missing file, a row's agent loop, a plugin, an override) prints one short
block naming where it is and exits 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl import __version__
from agentrl.config_help import ConfigHelpAction, did_you_mean
from agentrl.core.console import quiet_serve_logs

if TYPE_CHECKING:
    from agentrl.config import AgentRLConfig

logger = logging.getLogger("agentrl")

_BAD_INPUT = "agentrl_bad_input"
"""The attribute of a log record that reports bad input (printed plainly, see main)."""


def _compose(args: argparse.Namespace) -> AgentRLConfig:
    """The validated config of a command line: file, overrides, then the Ray address."""
    from agentrl.config import load_config

    cfg = load_config(args.config, args.overrides)
    # Which Ray cluster: --address, else ray.address, else $RAY_ADDRESS (set by `ray job
    # submit` for its entrypoint), else a new local instance.
    if args.address:
        cfg.ray.address = args.address
    elif cfg.ray.address is None and os.environ.get("RAY_ADDRESS"):
        cfg.ray.address = os.environ["RAY_ADDRESS"]
    return cfg


def _load(args: argparse.Namespace) -> AgentRLConfig:
    """``_compose`` ready to run, checked before anything starts: built-in models resolved,
    plugins imported; for ``train`` the run directory (``RunFinished`` when it is done,
    ``ResumeMismatch`` when it holds another run); then (``agentrl.preflight``) the files
    the command reads, the agent loops its rows name and, for ``train``, the algorithm."""
    from agentrl.config import ConfigError, resolve_user_config
    from agentrl.plugins import PluginError
    from agentrl.preflight import check_agent_loops, check_algorithm, check_inputs

    cfg = _compose(args)
    try:
        cfg = resolve_user_config(cfg)
    except PluginError as exc:
        where = f" (config file {args.config})" if args.config else ""
        raise ConfigError(f"plugins{where}: {exc}") from exc
    if not cfg.model.path:
        raise ConfigError("model.path is required (an HF id, a directory or builtin:<name>)")
    if args.command == "train":
        from agentrl.trainer.resume import check_resume

        check_resume(cfg)
    files = command_data_files(args, cfg)
    check_inputs(cfg, files)
    check_agent_loops(cfg, files)
    if args.command == "train":
        check_algorithm(cfg)
    return cfg


def _config(args: argparse.Namespace) -> int:
    import yaml

    print(yaml.safe_dump(_compose(args).model_dump(mode="json"), sort_keys=False), end="")
    return 0


def _serve(args: argparse.Namespace) -> int:
    cfg = _load(args)
    import contextlib
    import signal
    import threading

    from agentrl.placement import rollout_actor_resources
    from agentrl.server.launch import init_ray, start_rollout_servers, stop_rollout_servers

    init_ray(cfg.ray)
    client = start_rollout_servers(
        cfg.model, cfg.server, rollout_actor_resources(cfg.placement.rollout)
    )
    if cfg.gateway.enabled:
        from agentrl.server.gateway.deployment import start_gateway

        logger.info("gateway: %s", start_gateway(cfg.gateway, cfg.model, cfg.server))
    try:
        if args.demo:
            import asyncio

            from transformers import AutoTokenizer

            from agentrl.server.demo import run_serving_demo

            tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer)
            asyncio.run(run_serving_demo(client, tokenizer, cfg.model.path))
        else:
            logger.info("rollout servers up (app %r); Ctrl-C to stop", cfg.server.name)
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            with contextlib.suppress(KeyboardInterrupt):
                stop.wait()
    finally:
        if cfg.gateway.enabled:
            from agentrl.server.gateway.deployment import stop_gateway

            stop_gateway(cfg.gateway)
        stop_rollout_servers(cfg.server)
    return 0


def _train(args: argparse.Namespace) -> int:
    from agentrl.trainer.resume import RunFinished

    try:
        cfg = _load(args)
    except RunFinished as finished:  # raised before anything started: nothing to stop
        logger.info("%s", finished)
        return 0
    import asyncio

    from agentrl.trainer.async_trainer import AsyncTrainer
    from agentrl.trainer.trainer import Trainer

    trainer_cls = Trainer if args.sync else AsyncTrainer
    trainer = trainer_cls(cfg)
    trainer.setup()
    try:
        history = asyncio.run(trainer.fit())
    finally:
        trainer.shutdown()
    logger.info("trained %d steps; run directory %s", len(history), cfg.trainer.run_dir)
    return 0


def _eval(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from agentrl.evaluate import evaluate, format_result

    out = Path(args.out) if args.out else Path(cfg.trainer.run_dir) / "eval.json"
    result = evaluate(cfg, args.checkpoint, out)
    print(format_result(result, out))
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from agentrl.sim_planner import run_simulate

    return run_simulate(args, _load)


def command_data_files(args: argparse.Namespace, cfg: AgentRLConfig) -> list[str]:
    """The data files ``args.command`` reads: train and eval both splits (``Trainer.setup``
    loads both), rollout its ``--split``, the others none."""
    if args.command in ("train", "eval"):
        return [*cfg.data.train_files, *cfg.data.val_files]
    if args.command == "rollout":
        return list(cfg.data.train_files if args.split == "train" else cfg.data.val_files)
    return []


def _rollout(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from agentrl.rollout.run import rollout

    result = rollout(cfg, args.out, split=args.split, limit=args.limit)
    width = max((len(k) for k in result.metrics), default=0)
    lines = [f"  {k:<{width}}  {v:.4g}" for k, v in sorted(result.metrics.items())]
    print("\n".join(lines))
    print(f"{len(result.trajectories)} episodes ({result.failed} failed) -> {result.out}")
    return 0


def _plot(args: argparse.Namespace) -> int:
    from agentrl.plot import CHARTS, plot_run

    try:
        report = plot_run(args.run_dir, args.out)
    except FileNotFoundError as exc:
        return _bad_input(str(exc))
    if not report.written:
        logger.error(
            "%s has none of the plotted metrics (%s)",
            args.run_dir,
            ", ".join(s.key for c in CHARTS for s in c.series),
        )
        return 1
    print(f"plotted {', '.join(report.written)} -> {report.out_dir}")
    if report.skipped:
        print(f"skipped (not in the metrics): {', '.join(report.skipped)}")
    return 0


def _audit(args: argparse.Namespace) -> int:
    from agentrl.trainer.audit import AuditError, read_row_audit

    try:
        counts = read_row_audit(args.run_dir)
    except AuditError as exc:
        return _bad_input(str(exc))
    for name, value in counts.as_dict().items():
        print(f"{name:24} {value}")
    if counts.rows_lost and not counts.ended_with_checkpoint:
        print(
            "the run did not end with a saved checkpoint: the rows it held since its last "
            "one count as lost; resuming it (trainer.resume=true) hands them out again"
        )
    return 1 if counts.rows_lost or counts.rows_trained_twice else 0


def _bench(args: argparse.Namespace) -> int:
    from agentrl.testing.benchmarks import BenchmarkError, run_benchmark

    try:
        return run_benchmark(args.name, args.args)
    except BenchmarkError as exc:
        return _bad_input(str(exc))


def _bench_epilog() -> str:
    from agentrl.testing.benchmarks import BenchmarkError, available_benchmarks, find_bench_dir

    try:
        bench_dir = find_bench_dir()
    except BenchmarkError as exc:
        return str(exc)
    names = available_benchmarks(bench_dir)
    return f"benchmarks in {bench_dir}:\n  " + "\n  ".join(names)


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose epilog may be computed only when its help is shown
    (``bench``'s lists the benchmark scripts, which it must not look for otherwise)."""

    def __init__(self, *args: Any, epilog_factory: Callable[[], str] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._epilog_factory = epilog_factory

    @property
    def epilog(self) -> str | None:
        factory = getattr(self, "_epilog_factory", None)
        if factory is not None:
            self._epilog, self._epilog_factory = factory(), None
        return self._epilog

    @epilog.setter
    def epilog(self, value: str | None) -> None:
        self._epilog, self._epilog_factory = value, None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="agentrl", description="Asynchronous agentic RL for LLMs.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--version", action="version", version=f"agentrl {__version__}", help="print the version"
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def config_command(name: str, help_text: str, description: str | None = None):
        command = commands.add_parser(name, help=help_text, description=description, add_help=False)
        command.add_argument("-h", "--help", action=ConfigHelpAction, command=name)
        command.add_argument("config", nargs="?", help="YAML config file (omit for defaults)")
        command.add_argument("overrides", nargs="*", help="dotted overrides: section.key=value")
        command.add_argument(
            "--address",
            help="Ray cluster to join (host:port or `auto`; sets ray.address). Default: "
            "ray.address, else $RAY_ADDRESS, else start a local Ray",
        )
        return command

    serve = config_command("serve", "start the rollout servers (Ray Serve + vLLM), no training")
    serve.add_argument(
        "--demo", action="store_true", help="run scripted multi-turn sessions, print, exit"
    )
    serve.set_defaults(run=_serve)

    train = config_command(
        "train", "train a policy (rollout servers + agent loops + FSDP2 workers)"
    )
    train.add_argument(
        "--sync",
        action="store_true",
        help="the synchronous trainer (default: async with trainer.max_staleness)",
    )
    train.set_defaults(run=_train)

    evaluate = config_command(
        "eval", "validate a checkpoint: load it, push its weights, run Trainer.validate"
    )
    evaluate.add_argument(
        "--checkpoint",
        required=True,
        help="checkpoint directory (RUN_DIR/checkpoints/step_N), or a run directory "
        "(its latest checkpoint)",
    )
    evaluate.add_argument(
        "--out", help="where to write the result JSON (default: <trainer.run_dir>/eval.json)"
    )
    evaluate.set_defaults(run=_eval)

    rollout = config_command(
        "rollout",
        "run the agent loops over a dataset without training; one JSON line per episode",
    )
    rollout.add_argument(
        "--out", default="trajectories.jsonl", help="JSONL file to write (default: %(default)s)"
    )
    rollout.add_argument(
        "--split",
        choices=("train", "val"),
        default="train",
        help="rows from data.train_files or data.val_files (default: %(default)s)",
    )
    rollout.add_argument("--limit", type=int, help="only the first LIMIT rows")
    rollout.set_defaults(run=_rollout)

    simulate = config_command(
        "simulate",
        "plan a GPU cluster: the config on simulated GPUs, the best rollout/training split",
        description="Train CONFIG for a few steps on the simulated engine and trainer of "
        "--profile (its loops and tools run for real), then replay the recorded episodes "
        "on every split of --gpus GPUs between rollout replicas and training; print the "
        "expected step time, each pool's utilization and the split of most trained "
        "tokens/s (docs/concepts/simulation.md, Capacity planner).",
    )
    simulate.add_argument("--profile", required=True, help="model/GPU profile to simulate")
    simulate.add_argument("--gpus", type=int, required=True, help="GPUs to split")
    simulate.add_argument(
        "--steps", type=int, default=2, help="training steps recorded (default: %(default)s)"
    )
    simulate.add_argument(
        "--time-scale",
        type=float,
        default=0.001,
        help="wall seconds per modeled second while recording (default: %(default)s)",
    )
    simulate.add_argument(
        "--sync",
        action="store_true",
        help="plan the synchronous trainer (as `train --sync`); default: async with "
        "trainer.max_staleness",
    )
    simulate.add_argument("--json", help="also write the result to this JSON file")
    simulate.set_defaults(run=_simulate)

    show = config_command(
        "config",
        "validate a config and print it with every default filled in (YAML); starts nothing",
        description="Print the config that `agentrl train CONFIG [overrides]` would run, as "
        "YAML, after validating every key and value; exits 2 naming what is wrong. Built-in "
        "model names stay unresolved and plugins are not imported.",
    )
    show.set_defaults(run=_config)

    plot = commands.add_parser(
        "plot",
        help="write PNG curves (reward, accuracy, lengths, turns, tool calls, KL, staleness)",
        description="Plot a run's metrics.jsonl: one PNG per chart with data, plus overview.png.",
    )
    plot.add_argument("run_dir", help="run directory holding metrics.jsonl (or the file itself)")
    plot.add_argument("--out", help="folder for the PNGs (default: RUN_DIR/plots)")
    plot.set_defaults(run=_plot)

    audit = commands.add_parser(
        "audit",
        help="count a run's rows lost or trained twice, from RUN_DIR/audit.jsonl alone",
        description="Replay a run directory's audit.jsonl (resumes included): rows handed "
        "out, trained, trained twice, dropped, pending at the last checkpoint and lost. "
        "Exits 1 when a row was lost or trained twice, 2 when the audit cannot be read.",
    )
    audit.add_argument("run_dir", help="run directory holding audit.jsonl")
    audit.set_defaults(run=_audit)

    bench = commands.add_parser(
        "bench",
        help="run a benchmark script: bench/NAME.py with the remaining arguments",
        description="Run bench/NAME.py's main() with ARGS as its command line "
        "(`agentrl bench NAME --help` shows the benchmark's own options).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog_factory=_bench_epilog,
    )
    bench.add_argument("name", help="benchmark name (a script bench/NAME.py)")
    bench.add_argument(
        "args", nargs=argparse.REMAINDER, help="arguments passed to the benchmark's main()"
    )
    bench.set_defaults(run=_bench)
    return parser


def _verbs(parser: argparse.ArgumentParser) -> list[str]:
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(commands.choices)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse a command line; overrides may come before or after options. An unknown verb
    is an error naming the closest one."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    verb = next((a for a in argv if not a.startswith("-")), None)
    verbs = _verbs(parser)
    if verb is not None and verb not in verbs:
        hint = did_you_mean(verb, verbs)
        parser.error(
            f"unknown command {verb!r}; {f'{hint} ' if hint else ''}commands: {', '.join(verbs)}"
        )
    args, extra = parser.parse_known_args(argv)
    if extra:
        # argparse stops filling `overrides` at the first option: collect the rest here.
        if hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
            args.overrides += extra
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    # A first positional that looks like an override is an override, not a config file.
    if getattr(args, "config", None) and "=" in args.config:
        args.overrides.insert(0, args.config)
        args.config = None
    return args


def _bad_input(message: str) -> int:
    """Report an error in what the user gave (printed as it is, see ``main``); exit 2."""
    logger.error("%s", message, extra={_BAD_INPUT: True})
    return 2


def _configure_logging(verbose: bool) -> None:
    """Logs through rich; a bad-input report as plain ``error: ...`` lines on stderr, so
    that a multi-line message keeps its layout (no log columns, no wrapping)."""
    from rich.logging import RichHandler

    rich = RichHandler(rich_tracebacks=True, show_path=False)
    rich.addFilter(lambda record: not getattr(record, _BAD_INPUT, False))
    plain = logging.StreamHandler(sys.stderr)
    plain.setFormatter(logging.Formatter("error: %(message)s"))
    plain.addFilter(lambda record: getattr(record, _BAD_INPUT, False))
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[rich, plain],
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _configure_logging(args.verbose)
    quiet_serve_logs(not args.verbose)
    if args.verbose and hasattr(args, "overrides"):
        args.overrides.insert(0, "ray.log_to_driver=true")  # first: an explicit one still wins
    try:
        return args.run(args)
    except (ValueError, ImportError) as exc:
        # Bad input: a ConfigError (the preflight's kinds too) or another ValueError naming
        # what is wrong, or a PluginError (an ImportError); their modules load lazily.
        from agentrl.plugins import PluginError
        from agentrl.preflight import MissingInputs

        if isinstance(exc, ImportError) and not isinstance(exc, PluginError):
            raise
        logger.debug("the error's traceback", exc_info=exc)
        message = str(exc)
        if isinstance(exc, MissingInputs) and args.config:
            message += f" (the comments at the top of {args.config} say which)"
        return _bad_input(message)


if __name__ == "__main__":
    sys.exit(main())
