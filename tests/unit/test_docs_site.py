"""The docs site builds with ``mkdocs build --strict``: no broken link, anchor or docstring,
every page in the nav, and its generated reference holds every config key and CLI verb.
README's links into docs/ resolve to pages and anchors of the built site."""

from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentrl.cli import build_parser
from agentrl.config_help import config_fields

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).parent / "mkdocs"
LINK = re.compile(r"\]\(([^)\s]+)\)")
ROW = re.compile(r"<tr>\s*(.*?)\s*</tr>", re.S)
CELL = re.compile(r"<td>(.*?)</td>", re.S)
TAG = re.compile(r"<[^>]+>")

pytestmark = pytest.mark.skipif(not MKDOCS.exists(), reason="mkdocs is not installed")


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    result = build(ROOT / "mkdocs.yml", site)
    assert result.returncode == 0, result.stdout + result.stderr
    return site


def page(site: Path, doc: str) -> str:
    """The built HTML of ``doc`` (a path under docs/, e.g. ``reference/config.md``)."""
    stem = doc.removesuffix(".md")
    target = site / "index.html" if stem == "index" else site / stem / "index.html"
    return target.read_text()


def text(cell: str) -> str:
    return html.unescape(TAG.sub("", cell)).strip()


def test_every_page_under_docs_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(entry) -> list[str]:
        if isinstance(entry, str):
            return [entry]
        if isinstance(entry, list):
            return [p for item in entry for p in pages(item)]
        return [p for value in entry.values() for p in pages(value)]

    in_nav = set(pages(config["nav"]))
    on_disk = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert on_disk - in_nav == set()
    assert in_nav - on_disk == set()


def test_config_reference_lists_every_key_with_its_type_and_default(site):
    rows = {}
    for row in ROW.findall(page(site, "reference/config.md")):
        cells = [text(c) for c in CELL.findall(row)]
        if cells:
            rows[cells[0]] = cells
    fields = list(config_fields())
    assert len(fields) > 100
    for field in fields:
        assert field.key in rows, f"{field.key} missing from the config reference"
        _, type_name, default, description = rows[field.key]
        assert (type_name, default) == (field.type, repr(field.default)), field.key
        # the description as written, less the backticks of its code spans
        assert description == " ".join(field.description.replace("`", "").split()), field.key


def test_cli_reference_has_a_section_per_verb(site):
    parser = build_parser()
    (verbs,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {"train", "eval", "rollout", "serve", "config", "plot"} <= set(verbs.choices)
    built = html.unescape(TAG.sub("", page(site, "reference/cli.md")))
    for name, verb in verbs.choices.items():
        assert f"agentrl {name}" in built
        assert verb.format_usage().split()[1] in built  # the usage line of its --help


def test_api_reference_documents_the_public_namespace(site):
    import agentrl
    import agentrl.testing

    built = page(site, "reference/api.md")
    ids = set(re.findall(r'id="([\w.]+)"', built))
    documented = {i.rsplit(".", 1)[-1] for i in ids}
    core = {
        "AgentLoopBase",
        "Conversation",
        "TrajectoryBuilder",
        "SamplingParams",
        "tool",
        "BaseTool",
        "load_config",
        "rollout",
        "arollout",
        "start_rollout_servers",
        "RewardFunction",
    }
    assert core <= documented
    assert {"ScriptedClient", "loop_context", "default_tiny_checkpoint"} <= documented
    for name in core:
        assert name in agentrl.__all__, f"{name} is documented but not exported"
    assert "ScriptedClient" in agentrl.testing.__all__


def test_a_broken_anchor_fails_the_build(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    with (docs / "index.md").open("a") as f:
        f.write("\n[broken](concepts/serving.md#no-such-section)\n")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["docs_dir"] = str(docs)
    config["hooks"] = [str(ROOT / h) for h in config["hooks"]]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    result = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-section" in result.stdout + result.stderr


def test_readme_links_into_docs_resolve(site):
    readme = (ROOT / "README.md").read_text()
    links = [
        link
        for link in LINK.findall(readme)
        if link.startswith("docs/") or link.startswith("./docs/")
    ]
    assert links, "README links to no docs page"
    for link in links:
        path, _, anchor = link.removeprefix("./").partition("#")
        assert (ROOT / path).exists(), f"README links to {path}, which does not exist"
        if path.endswith(".md") and anchor:
            ids = re.findall(r'id="([^"]+)"', page(site, path.removeprefix("docs/")))
            assert anchor in ids, f"README links to {link}: no such anchor"
