"""``agentrl COMMAND --help [SECTION]``: the config keys a command reads, by section.

Each key shows its default, its allowed values when it is a choice (a ``Literal`` or an
``Enum``) and its description, wrapped to the terminal's width.
"""

from __future__ import annotations

import argparse
import enum
import shutil
import textwrap
import types
from collections.abc import Iterator, Sequence
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from agentrl.config import AgentRLConfig

__all__ = ["COMMAND_SECTIONS", "ConfigHelpAction", "config_help", "field_choices"]

_ROLLOUT_SIDE = ("plugins", "model", "server", "gateway", "placement.rollout", "ray")
COMMAND_SECTIONS: dict[str, tuple[str, ...] | None] = {
    "train": None,  # every section
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

_INDENT = "  "


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


def _is_section(field: FieldInfo) -> bool:
    annotation = field.annotation
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _leaves(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, FieldInfo]]:
    for name, field in model.model_fields.items():
        if _is_section(field):
            yield from _leaves(field.annotation, f"{prefix}{name}.")  # type: ignore[arg-type]
        else:
            yield f"{prefix}{name}", field


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


def _selected(key: str, sections: Sequence[str]) -> bool:
    return any(key == s or key.startswith(f"{s}.") for s in sections)


def config_help(command: str, section: str | None = None, width: int | None = None) -> str:
    """The config keys ``command`` reads (only ``section``'s, when given), one heading per
    top-level section, wrapped to ``width`` (default: the terminal's).

    Raises:
        ValueError: ``section`` is no section (or key prefix) that ``command`` reads.
    """
    width = width or shutil.get_terminal_size().columns - 2
    sections = COMMAND_SECTIONS[command] or tuple(AgentRLConfig.model_fields)
    keys = [(k, f) for k, f in _leaves(AgentRLConfig, "") if _selected(k, sections)]
    if section is not None:
        keys = [(k, f) for k, f in keys if _selected(k, [section])]
        if not keys:
            tops = dict.fromkeys(s.split(".")[0] for s in sections)
            raise ValueError(
                f"agentrl {command} reads no config section {section!r}; it reads: "
                + ", ".join(tops)
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
    """``-h/--help [SECTION]``: the command's usage and options, then its config keys."""

    def __init__(self, option_strings: list[str], dest: str, command: str) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs="?",
            default=argparse.SUPPRESS,
            metavar="SECTION",
            help="show this help and the config keys this command reads (only SECTION's, "
            "e.g. rollout or server.engine), then exit",
        )
        self.command = command

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        try:
            keys = config_help(self.command, values)
        except ValueError as exc:
            parser.error(str(exc))
        print(f"{parser.format_help()}\n{keys}", end="")
        parser.exit()
