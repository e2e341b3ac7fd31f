"""The ``agentrl`` command line: every option is described; ``bench`` runs bench scripts."""

from __future__ import annotations

import argparse
import json
import logging
import re
import subprocess
import sys
import textwrap

import pytest
import yaml

from agentrl.cli import build_parser, main, parse_args
from agentrl.config import describe_config
from agentrl.testing.benchmarks import (
    BenchmarkError,
    available_benchmarks,
    find_bench_dir,
    run_benchmark,
)

COMMANDS = ("serve", "train", "eval", "rollout", "config", "plot", "audit", "bench", "simulate")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_command_and_option_has_a_description():
    parser = build_parser()
    commands = _subparsers(parser)
    assert set(commands) == set(COMMANDS)
    for name, command in commands.items():
        for action in command._actions:
            assert action.help, (
                f"agentrl {name}: {action.option_strings or action.dest} has no help"
            )


def _help(argv: list[str], capsys, monkeypatch, columns: int = 80) -> str:
    """What ``agentrl ARGV`` prints (it exits 0) in a terminal ``columns`` wide."""
    monkeypatch.setenv("COLUMNS", str(columns))
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    return capsys.readouterr().out


def _keys(text: str) -> set[str]:
    """The config keys a help text lists (each starts an indented line)."""
    return {m.group(1) for m in re.finditer(r"^  ([a-z_]+(?:\.[a-z_0-9]+)*) \(default", text, re.M)}


ALL_KEYS = {line.split(" (default")[0] for line in describe_config()}


@pytest.mark.parametrize("name", ["train", "config"])
def test_train_and_config_help_all_list_every_config_key(name, capsys, monkeypatch):
    assert _keys(_help([name, "--help", "all"], capsys, monkeypatch)) == ALL_KEYS


def _sections(text: str) -> dict[str, int]:
    """The sections a ``--help`` overview lists, with their key counts."""
    return {
        m.group(1): int(m.group(2)) for m in re.finditer(r"^  ([a-z_.]+) +(\d+) keys? ", text, re.M)
    }


@pytest.mark.parametrize("columns", [60, 100])
@pytest.mark.parametrize("name", ["serve", "train", "eval", "rollout", "config"])
def test_help_lists_the_sections_with_their_key_counts_and_no_keys(
    name, columns, capsys, monkeypatch
):
    text = _help([name, "--help"], capsys, monkeypatch, columns)
    assert text.startswith(f"usage: agentrl {name}")
    assert max(len(line) for line in text.splitlines()) <= columns
    assert not _keys(text)
    assert len(text.splitlines()) < 80
    sections = _sections(text)
    assert {"plugins", "model", "server", "ray"} <= set(sections)
    assert sections["server"] == sum(k.startswith("server.") for k in ALL_KEYS)
    assert "--help SECTION" in text and "--help all" in text


def test_the_sections_of_a_command_are_the_keys_it_reads(capsys, monkeypatch):
    sections = _sections(_help(["eval", "--help"], capsys, monkeypatch, 100))
    keys = _keys(_help(["eval", "--help", "all"], capsys, monkeypatch))
    assert {"workers.actor", "placement.trainer", "placement.rollout"} <= set(sections)
    assert "workers" not in sections and "algorithm" not in sections
    assert sum(sections.values()) == len(keys)


@pytest.mark.parametrize("columns", [60, 100])
@pytest.mark.parametrize("name", ["serve", "train", "eval", "rollout", "config"])
def test_help_all_fits_the_terminal_under_section_headings(name, columns, capsys, monkeypatch):
    text = _help([name, "--help", "all"], capsys, monkeypatch, columns)
    assert max(len(line) for line in text.splitlines()) <= columns
    heading, headings = None, []
    for line in text.splitlines():
        if re.fullmatch(r"[a-z_]+:", line):
            heading = line[:-1]
            headings.append(heading)
        elif key := re.match(r"  ([a-z_.0-9]+) \(default", line):
            assert key.group(1).split(".")[0] == heading, line  # under its section's heading
    assert {"plugins", "model", "server", "ray"} <= set(headings)
    assert len(headings) == len(set(headings))


def test_each_command_lists_only_the_sections_it_reads(capsys, monkeypatch):
    serve = _keys(_help(["serve", "--help", "all"], capsys, monkeypatch))
    assert "server.num_replicas" in serve and "gateway.enabled" in serve
    assert "placement.rollout.node_resource" in serve
    for absent in ("trainer.", "algorithm.", "workers.", "data.", "placement.trainer."):
        assert not any(k.startswith(absent) for k in serve), absent
    rollout = _keys(_help(["rollout", "--help", "all"], capsys, monkeypatch))
    assert {"data.val_files", "rollout.agent_name", "reward.reward_fn_path"} <= rollout
    assert not any(k.startswith(("trainer.", "algorithm.")) for k in rollout)
    evaluate = _keys(_help(["eval", "--help", "all"], capsys, monkeypatch))
    assert {"trainer.val_n", "workers.actor.world_size", "weight_sync.kind"} <= evaluate
    assert not any(k.startswith(("algorithm.", "workers.critic.")) for k in evaluate)


def test_a_choice_lists_its_allowed_values(capsys, monkeypatch):
    text = _help(["train", "--help", "all"], capsys, monkeypatch, 200)
    assert "trainer.stale_policy (default 'drop'; one of: drop, downweight)" in text
    assert "one of: error, allow" in text  # trainer.resume_mismatch


def test_help_section_shows_only_that_section(capsys, monkeypatch):
    keys = _keys(_help(["train", "--help", "rollout"], capsys, monkeypatch))
    assert "rollout.agent_name" in keys and all(k.startswith("rollout.") for k in keys)
    engine = _keys(_help(["serve", "--help", "server.engine"], capsys, monkeypatch))
    assert "server.engine.backend" in engine
    assert all(k.startswith("server.engine.") for k in engine)


def test_help_of_a_section_the_command_does_not_read_is_an_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--help", "trainer"])
    assert exit_.value.code == 2
    assert "reads no config section 'trainer'" in capsys.readouterr().err


def test_help_of_a_misspelt_section_names_the_closest(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--help", "rollot"])
    assert exit_.value.code == 2
    assert "no config section 'rollot'; did you mean rollout?" in capsys.readouterr().err


def test_help_followed_by_the_config_file_shows_the_overview(capsys, monkeypatch):
    text = _help(["train", "--help", "run.yaml"], capsys, monkeypatch)
    assert _sections(text) and not _keys(text)


def test_an_unknown_verb_names_the_closest(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["trian", "run.yaml"])
    assert exit_.value.code == 2
    assert "unknown command 'trian'; did you mean train?" in capsys.readouterr().err


def test_version_prints_the_package_version(capsys):
    from agentrl import __version__

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"agentrl {__version__}"


@pytest.fixture
def bench_dir(tmp_path, monkeypatch):
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "echo_args.py").write_text(
        textwrap.dedent(
            '''
            """Writes its arguments to the file named by the first one."""
            from __future__ import annotations

            import json
            import sys
            from dataclasses import dataclass


            @dataclass
            class Result:  # a dataclass with string annotations needs its module registered
                args: list[str]


            def main() -> None:
                out, *rest = sys.argv[1:]
                with open(out, "w") as f:
                    json.dump({"argv0": sys.argv[0], "args": Result(rest).args}, f)
                if "--fail" in rest:
                    sys.exit(3)


            if __name__ == "__main__":
                main()
            '''
        )
    )
    (bench / "_helpers.py").write_text("X = 1\n")
    (bench / "no_main.py").write_text("print('hi')\n")
    monkeypatch.setenv("AGENTRL_BENCH_DIR", str(bench))
    return bench


def test_bench_runs_the_scripts_main_with_the_remaining_arguments(bench_dir, tmp_path):
    out = tmp_path / "out.json"
    assert main(["bench", "echo_args", str(out), "--steps", "3", "-x"]) == 0
    result = json.loads(out.read_text())
    assert result == {"argv0": str(bench_dir / "echo_args.py"), "args": ["--steps", "3", "-x"]}


def test_bench_returns_the_scripts_exit_status(bench_dir, tmp_path):
    assert run_benchmark("echo_args.py", [str(tmp_path / "o.json"), "--fail"]) == 3


def test_unknown_benchmark_lists_the_available_ones(bench_dir, caplog):
    assert available_benchmarks(find_bench_dir()) == ["echo_args", "no_main"]
    assert main(["bench", "nope"]) == 2
    assert "unknown benchmark 'nope'" in caplog.text
    assert "echo_args, no_main" in caplog.text
    with pytest.raises(BenchmarkError, match="has no main"):
        run_benchmark("no_main", [])


def test_bench_help_names_the_available_benchmarks(bench_dir):
    text = _subparsers(build_parser())["bench"].format_help()
    assert f"benchmarks in {bench_dir}" in text
    assert "echo_args" in text


def test_the_repository_bench_folder_is_found_from_anywhere(monkeypatch, tmp_path):
    monkeypatch.delenv("AGENTRL_BENCH_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    names = available_benchmarks(find_bench_dir())
    assert {"prefix_affinity", "agent_loop_overhead", "async_vs_sync"} <= set(names)


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "c.yaml", "--sync", "trainer.total_steps=3", "rollout.n=2"],
        ["train", "c.yaml", "trainer.total_steps=3", "--sync", "rollout.n=2"],
        ["train", "--sync", "c.yaml", "trainer.total_steps=3", "rollout.n=2"],
    ],
)
def test_overrides_may_come_before_or_after_options(argv):
    args = parse_args(argv)
    assert args.sync
    assert sorted(args.overrides) == ["rollout.n=2", "trainer.total_steps=3"]
    assert args.config == "c.yaml"


def test_a_stray_option_is_still_an_error(capsys):
    with pytest.raises(SystemExit):
        parse_args(["train", "c.yaml", "--nope", "a=1"])
    assert "unrecognized arguments: --nope" in capsys.readouterr().err


def test_rollout_command_takes_out_split_and_limit():
    args = parse_args(["rollout", "run.yaml", "rollout.n=2", "--split", "val", "--limit", "3"])
    assert (args.config, args.overrides, args.split, args.limit) == (
        "run.yaml",
        ["rollout.n=2"],
        "val",
        3,
    )
    assert args.out == "trajectories.jsonl"
    with pytest.raises(SystemExit):
        parse_args(["rollout", "run.yaml", "--split", "test"])


def test_config_prints_the_resolved_config_without_importing_ray(tmp_path):
    (tmp_path / "run.yaml").write_text("model:\n  path: /models/a\nrollout:\n  n: 4\n")
    script = (
        "import sys; from agentrl.cli import main; code = main(sys.argv[1:]); "
        "print('ray imported' if 'ray' in sys.modules else 'no ray', file=sys.stderr); "
        "sys.exit(code)"
    )
    argv = ["config", str(tmp_path / "run.yaml"), "rollout.n=8", "server.num_replicas=3"]
    done = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "no ray" in done.stderr
    printed = yaml.safe_load(done.stdout)
    assert printed["model"]["path"] == "/models/a"
    assert printed["rollout"]["n"] == 8 and printed["server"]["num_replicas"] == 3
    assert printed["trainer"]["run_dir"] == "runs/run"  # named after the config file
    assert printed["trainer"]["total_steps"] == 20  # every default filled in


@pytest.mark.parametrize(
    ("override", "named"),
    [("rollout.nn=2", "nn"), ("rollout.n=0", "rollout.n"), ("trainer.resume_mismatch=x", "allow")],
)
def test_config_rejects_a_bad_key_or_value_with_exit_status_2(override, named, capsys, caplog):
    assert main(["config", override]) == 2
    assert named in caplog.text
    assert capsys.readouterr().out == ""


def test_config_reports_a_missing_file(tmp_path, caplog):
    assert main(["config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml not found" in caplog.text


@pytest.fixture
def serve_logger():
    """The ``ray.serve`` logger, as importing ray.serve leaves it, restored afterwards."""
    logger = logging.getLogger("ray.serve")
    saved = (logger.level, list(logger.filters), list(logger.handlers), logger.propagate)
    yield logger
    logger.setLevel(saved[0])
    logger.filters[:], logger.handlers[:], logger.propagate = saved[1], saved[2], saved[3]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("verbose", [False, True])
def test_serve_s_driver_info_is_silenced_even_after_ray_serve_is_imported(
    verbose, serve_logger, capsys
):
    assert main([*(["-v"] if verbose else []), "config"]) == 0
    capsys.readouterr()
    # What `import ray.serve` does when the command gets to it (configure_default_serve
    # _logger): its own level and handler, not propagated.
    serve_logger.setLevel(logging.INFO)
    records = _Records()
    serve_logger.handlers[:], serve_logger.propagate = [records], False
    serve_logger.info("Deployed app 'rollout' successfully.")
    serve_logger.warning("a replica is slow to start")
    shown = [r.getMessage() for r in records.records]
    if verbose:
        assert shown == ["Deployed app 'rollout' successfully.", "a replica is slow to start"]
    else:
        assert shown == ["a replica is slow to start"]


def test_verbose_echoes_workers_output_unless_the_command_line_says_otherwise(capsys):
    assert main(["-v", "config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["ray"]["log_to_driver"] is True
    assert main(["-v", "config", "ray.log_to_driver=false"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["ray"]["log_to_driver"] is False
    assert main(["config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["ray"]["log_to_driver"] is False
