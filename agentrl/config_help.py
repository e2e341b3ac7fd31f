"""The config keys, described from the pydantic models: ``agentrl COMMAND --help``, the
config reference of the docs and the wording of config errors all come from here.

``config_fields()`` yields every leaf key with its type, default and description (the docs
render their config reference from it); ``config_help()`` and ``section_overview()`` are the
``--help`` texts: ``agentrl train --help`` lists the sections, ``--help SECTION`` one
section's keys, ``--help all`` every key.

This module loads no pydantic model at import time (``agentrl --help`` answers without the
config tree): the functions that read ``AgentRLConfig`` import it when called.
"""

from __future__ import annotations

import argparse
import difflib
import enum
import shutil
import textwrap
import types
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Union, get_args, get_origin

if TYPE_CHECKING:
    from pydantic import BaseModel
    from pydantic.fields import FieldInfo

__all__ = [
    "COMMAND_SECTIONS",
    "ConfigField",
    "ConfigHelpAction",
    "SectionSummary",
    "close_files",
    "config_fields",
    "config_help",
    "did_you_mean",
    "field_choices",
    "section_overview",
    "section_summaries",
    "type_name",
]

_ROLLOUT_SIDE = ("plugins", "model", "server", "gateway", "placement.rollout", "ray")
COMMAND_SECTIONS: dict[str, tuple[str, ...] | None] = {
    "train": None,  # every section
    "simulate": None,  # a simulated training run (agentrl.sim_planner)
    "config": None,
    # agentrl serve: the rollout servers and the gateway (agentrl.cli._serve).
    "serve": _ROLLOUT_SIDE,
    # rollout(): servers, gateway and agent-loop workers over a data split, scored.
    "rollout": (*_ROLLOUT_SIDE, "data", "rollout", "reward"),
    # evaluate(): Trainer.setup without reference or critic, then Trainer.validate.
    "eval": (
        *_ROLLOUT_SIDE,
        "data",
        "rollout",
        "reward",
        "workers.actor",
        "placement.trainer",
        "weight_sync",
        "trainer",
        "logging",
    ),
}
"""The config sections each command reads (dotted for a part of a section); None: all."""

ALL = "all"
"""``--help all``: every key the command reads."""

_INDENT = "  "


class ConfigField(NamedTuple):
    """One leaf key of the config tree."""

    key: str
    """Dotted path, e.g. ``server.engine.max_model_len``."""
    type: str
    """The annotation as a reader writes it: ``int``, ``str | None``, ``Literal['a', 'b']``."""
    default: Any
    """The default value (a factory's value for mutable defaults)."""
    description: str


class SectionSummary(NamedTuple):
    """One section of a command's ``--help`` overview."""

    name: str
    description: str
    keys: int


def did_you_mean(word: str, choices: Iterable[str], prefix: str = "") -> str:
    """``"did you mean PREFIX+X?"`` naming the choice closest to ``word`` (``""`` when
    none is close)."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {prefix}{close[0]}?" if close else ""


def close_files(path: str | Path) -> str:
    """``"did you mean X?"`` naming a file or folder next to the missing ``path`` whose
    name is close to its name (``""`` when none is)."""
    path = Path(path).expanduser()
    if not path.parent.is_dir():
        return ""
    names = [p.name for p in path.parent.iterdir()]
    close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
    return f"did you mean {path.parent / close[0]}?" if close else ""


def type_name(annotation: Any) -> str:
    """``annotation`` as a reader writes it: ``int``, ``str | None``, ``Literal['a', 'b']``."""
    if isinstance(annotation, type) and not get_args(annotation):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def field_choices(annotation: Any) -> list[str]:
    """The allowed values of a ``Literal``/``Enum`` annotation (also inside ``X | None``)."""
    origin = get_origin(annotation)
    if origin is Literal:
        return [str(value) for value in get_args(annotation)]
    if origin in (Union, types.UnionType):
        return [choice for arg in get_args(annotation) for choice in field_choices(arg)]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [str(member.value) for member in annotation]
    return []


def is_section(annotation: Any) -> bool:
    """Whether a field of this annotation is a section (a model of its own keys)."""
    from pydantic import BaseModel

    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _root() -> type[BaseModel]:
    from agentrl.config import AgentRLConfig

    return AgentRLConfig


def _leaves(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, FieldInfo]]:
    for name, field in model.model_fields.items():
        if is_section(field.annotation):
            yield from _leaves(field.annotation, f"{prefix}{name}.")  # type: ignore[arg-type]
        else:
            yield f"{prefix}{name}", field


def config_fields(model: type[BaseModel] | None = None) -> Iterator[ConfigField]:
    """Every leaf key of ``model`` (default: the whole ``AgentRLConfig`` tree), in the
    order the models declare them: its dotted key, type, default and description."""
    for key, field in _leaves(model or _root(), ""):
        yield ConfigField(
            key,
            type_name(field.annotation),
            field.get_default(call_default_factory=True),
            field.description or "",
        )


def _selected(key: str, sections: Sequence[str]) -> bool:
    return any(key == s or key.startswith(f"{s}.") for s in sections)


def _command_sections(command: str) -> tuple[str, ...]:
    return COMMAND_SECTIONS[command] or tuple(_root().model_fields)


def _section_description(path: str) -> str:
    """The first sentence of the description (else the docstring) of section ``path``."""
    model: Any = _root()
    field = None
    for part in path.split("."):
        field = model.model_fields[part]
        model = field.annotation
    text = field.description if field is not None and field.description else ""
    if not text and is_section(model) and "__doc__" in vars(model):
        text = (model.__doc__ or "").strip().split("\n\n")[0]
    text = " ".join(text.split())
    return text.split(". ")[0].rstrip(".")


def section_summaries(command: str) -> list[SectionSummary]:
    """The sections ``command`` reads, each with its one-line description and key count."""
    keys = [f.key for f in config_fields()]
    return [
        SectionSummary(s, _section_description(s), sum(_selected(k, [s]) for k in keys))
        for s in _command_sections(command)
    ]


def _width(width: int | None) -> int:
    return width or shutil.get_terminal_size().columns - 2


def section_overview(command: str, width: int | None = None) -> str:
    """``agentrl COMMAND --help``'s list of config sections: name, key count, one line."""
    width = _width(width)
    summaries = section_summaries(command)
    name_width = max(len(s.name) for s in summaries)
    lines = textwrap.wrap(
        f"Config sections agentrl {command} reads (set their keys in the YAML file or as "
        "overrides section.key=value):",
        width,
    )
    for summary in summaries:
        count = f"{summary.keys} key{'s' if summary.keys != 1 else ''}"
        head = f"{_INDENT}{summary.name:<{name_width}}  {count:>8}  "
        lines += textwrap.wrap(
            summary.description,
            max(width, len(head) + 20),
            initial_indent=head,
            subsequent_indent=" " * len(head),
        ) or [head.rstrip()]
    names = [s.name for s in summaries]
    example = "rollout" if "rollout" in names else "server"
    lines.append("")
    lines += textwrap.wrap(
        f"`agentrl {command} --help SECTION` lists one section's keys (e.g. --help "
        f"{example}); `--help {ALL}` lists every key, with its default and description.",
        width,
    )
    return "\n".join(lines) + "\n"


def _describe(key: str, field: FieldInfo, width: int) -> list[str]:
    default = field.get_default(call_default_factory=True)
    facts = [f"default {default!r}"]
    choices = field_choices(field.annotation)
    if choices:
        facts.append(f"one of: {', '.join(choices)}")
    head = textwrap.wrap(
        f"{key} ({'; '.join(facts)})",
        width,
        initial_indent=_INDENT,
        subsequent_indent=_INDENT * 3,
    )
    body = textwrap.wrap(
        field.description or "", width, initial_indent=_INDENT * 2, subsequent_indent=_INDENT * 2
    )
    return head + body


def config_help(command: str, section: str | None = None, width: int | None = None) -> str:
    """The config keys ``command`` reads (only ``section``'s, when given), one heading per
    top-level section, wrapped to ``width`` (default: the terminal's).

    Raises:
        ValueError: ``section`` is no section (or key prefix) that ``command`` reads; the
            message names the closest one.
    """
    width = _width(width)
    sections = _command_sections(command)
    keys = [(k, f) for k, f in _leaves(_root(), "") if _selected(k, sections)]
    if section is not None:
        keys = [(k, f) for k, f in keys if _selected(k, [section])]
        if not keys:
            names = [*dict.fromkeys(s.split(".")[0] for s in sections)]
            prefixes = {k.rsplit(".", 1)[0] for k, _ in _leaves(_root(), "")}
            hint = did_you_mean(section, [*names, *sorted(prefixes)])
            raise ValueError(
                f"agentrl {command} reads no config section {section!r}; "
                + (f"{hint} " if hint else "")
                + "it reads: "
                + ", ".join(names)
            )
    lines = textwrap.wrap(
        f"Config keys agentrl {command} reads, set in the YAML file or as overrides "
        "(section.key=value); `--help SECTION` shows one section:",
        width,
    )
    heading = None
    for key, field in keys:
        top = key.split(".")[0]
        if top != heading:
            heading = top
            lines += ["", f"{top}:"]
        lines += _describe(key, field, width)
    return "\n".join(lines) + "\n"


class ConfigHelpAction(argparse.Action):
    """``-h/--help [SECTION|all]``: the command's usage and options, then the sections it
    reads (``SECTION``: that section's keys; ``all``: every key)."""

    def __init__(self, option_strings: list[str], dest: str, command: str) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs="?",
            default=argparse.SUPPRESS,
            metavar="SECTION",
            help="show this help and the config sections this command reads, then exit; "
            "--help SECTION lists that section's keys (e.g. rollout or server.engine), "
            f"--help {ALL} every key",
        )
        self.command = command

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if isinstance(values, str) and values.endswith((".yaml", ".yml")):
            values = None  # `agentrl train --help run.yaml`: the config file, not a section
        try:
            if values is None:
                text = section_overview(self.command)
            else:
                text = config_help(self.command, None if values == ALL else values)
        except ValueError as exc:
            parser.error(str(exc))
        print(f"{parser.format_help()}\n{text}", end="")
        parser.exit()
