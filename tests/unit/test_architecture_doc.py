"""docs/concepts/architecture.md stays true: every file and folder it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "concepts" / "architecture.md"
# A repository path in backticks: a known top-level folder, then path characters.
PATH = re.compile(r"`((?:agentrl|server|agent_loops|tools|tests|docs|bench)/[\w./-]*)`")
# Bare file names the page gives right after a path of the same folder.
SIBLING = re.compile(r"`(\w+\.py)`")


def test_every_path_the_architecture_page_names_exists() -> None:
    text = PAGE.read_text()
    paths = PATH.findall(text)
    assert len(paths) > 20, "the page should name the files to start from"
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/concepts/architecture.md names paths that do not exist: {missing}"


def test_bare_file_names_on_the_architecture_page_exist_somewhere_in_the_package() -> None:
    text = PATH.sub("", PAGE.read_text())
    roots = [ROOT / d for d in ("agentrl", "server", "agent_loops", "tools")]
    missing = [
        name for name in SIBLING.findall(text) if not any(any(root.rglob(name)) for root in roots)
    ]
    assert not missing, f"docs/concepts/architecture.md names files that do not exist: {missing}"
