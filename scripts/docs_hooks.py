"""mkdocs hooks: the reference pages that are generated from the code at build time.

``docs/reference/config.md`` and ``docs/reference/cli.md`` hold their introduction and a
marker; the build puts the generated text in place of the marker, so the site can never
disagree with the code (on GitHub the pages show the introduction and say how to get the
same text from the CLI).
"""

from __future__ import annotations

import argparse
import functools
import shutil
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parents[1]

CONFIG_MARKER = "<!-- generated: config keys -->"
CLI_MARKER = "<!-- generated: cli verbs -->"
HELP_WIDTH = 88


def _prose(text: str) -> str:
    """A description (plain text with `code` spans) as one cell of a Markdown table: outside
    the code spans (where a table keeps them as they are) ``|``, brackets and ``<`` are
    escaped, so ``a | b``, ``hf:NAME[@SPLIT]`` and ``runs/<name>`` stay text."""
    parts = " ".join(text.split()).split("`")
    for i in range(0, len(parts), 2):
        for char, escaped in (("|", "\\|"), ("[", "\\["), ("]", "\\]"), ("<", "&lt;")):
            parts[i] = parts[i].replace(char, escaped)
    return "`".join(parts)


def _code(text: str) -> str:
    """``text`` as inline code in a table cell (backticks inside are doubled around)."""
    text = " ".join(text.split())
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def config_reference() -> str:
    """One table per top-level config section: every key, its type, default and doc."""
    from agentrl.config_help import config_fields

    lines: list[str] = []
    section = None
    for key, type_name, default, description in config_fields():
        top = key.split(".")[0]
        if top != section:
            section = top
            lines += ["", f"## `{top}`", "", "| key | type | default | description |"]
            lines.append("|---|---|---|---|")
        cells = (_code(key), _code(type_name), _code(repr(default)), _prose(description))
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines).lstrip() + "\n"


def _verbs(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each verb, in the order ``agentrl --help`` lists."""
    for action in parser._actions:  # argparse keeps its sub-commands on a private list
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, verb in action.choices.items():
                yield name, helps.get(name, ""), verb


def _help_text(parser: argparse.ArgumentParser) -> str:
    """``parser``'s usage and options at a fixed width, without an epilog (the bench verb's
    lists the benchmarks of the checkout it runs in)."""
    parser.formatter_class = functools.partial(parser.formatter_class, width=HELP_WIDTH)
    parser.epilog = None
    return parser.format_help().rstrip()


def cli_reference() -> str:
    """A section per ``agentrl`` verb: what it does and its ``--help`` text."""
    from agentrl.cli import build_parser

    parser = build_parser()
    lines = ["## `agentrl`", "", "```text", _help_text(parser), "```"]
    for name, summary, verb in _verbs(parser):
        lines += ["", f"## `agentrl {name}`", "", f"{summary[:1].upper()}{summary[1:]}."]
        lines += ["", "```text", _help_text(verb), "```"]
    return "\n".join(lines) + "\n"


GENERATED = {
    "reference/config.md": (CONFIG_MARKER, config_reference),
    "reference/cli.md": (CLI_MARKER, cli_reference),
}


def package_tree(root: Path) -> Path:
    """The ``agentrl`` package as it installs, laid out under ``root`` with symlinks.

    ``agent_loops/``, ``server/`` and ``tools/`` install as subpackages of ``agentrl``
    (setuptools ``package-dir``), which griffe's search of the source tree cannot follow; a
    tree of links in the installed layout lets it read every module statically.
    """
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    top = root / "agentrl"
    top.mkdir()
    for child in (ROOT / package_dir["agentrl"]).iterdir():
        if child.name != "__pycache__":
            (top / child.name).symlink_to(child)
    for name, folder in package_dir.items():
        if name != "agentrl":
            (top / name.removeprefix("agentrl.")).symlink_to(ROOT / folder)
    return root


_TREES: list[Path] = []


@event_priority(100)  # before mkdocstrings' own on_config, which starts its handlers
def on_config(config):
    """Point mkdocstrings at the installed layout of the package (see ``package_tree``)."""
    tree = package_tree(Path(tempfile.mkdtemp(prefix="agentrl-docs-")))
    _TREES.append(tree)
    config.plugins["mkdocstrings"].config.handlers["python"]["paths"] = [str(tree)]
    return config


def on_shutdown() -> None:
    """Remove the package trees this process made."""
    while _TREES:
        shutil.rmtree(_TREES.pop(), ignore_errors=True)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Put the generated text in place of its page's marker."""
    marker, render = GENERATED.get(page.file.src_uri, (None, None))
    if marker is None:
        return markdown
    if marker not in markdown:
        raise ValueError(f"{page.file.src_uri} lost its marker {marker}")
    return markdown.replace(marker, render())
