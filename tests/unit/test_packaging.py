"""Every Python package in the repository is declared in pyproject.toml, and the wheel
built from it holds the packages, the license, the entry point and consistent metadata.

``tests/e2e/test_wheel_install.py`` installs that wheel and runs it.
"""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PYTHON_CLASSIFIER = "Programming Language :: Python :: "


def wheel_sources(dest: Path) -> Path:
    """The files the wheel is built from, as pyproject.toml declares them (the package
    folders, the readme, the license files), copied to ``dest``: a build there leaves
    nothing in the checkout, and nothing stale of an earlier build gets into the wheel."""
    project = PYPROJECT["project"]
    folders = set(PYPROJECT["tool"]["setuptools"]["package-dir"].values())
    dest.mkdir()
    for name in ["pyproject.toml", project["readme"], *project["license-files"]]:
        shutil.copy2(ROOT / name, dest / name)
    for name in folders:
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """The wheel, built offline with this environment's setuptools."""
    base = tmp_path_factory.mktemp("wheel")
    src = wheel_sources(base / "src")
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    result = subprocess.run(
        [*build, "-w", str(base), str(src)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    (path,) = base.glob("agentrl-*.whl")
    with zipfile.ZipFile(path) as archive:
        yield archive


def _dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    version = PYPROJECT["project"]["version"]
    return wheel.read(f"agentrl-{version}.dist-info/{name}").decode()


def test_the_wheel_holds_every_declared_package_and_nothing_else(wheel):
    names = wheel.namelist()
    for package in PYPROJECT["tool"]["setuptools"]["packages"]:
        assert f"{package.replace('.', '/')}/__init__.py" in names, package
    assert {name.split("/")[0] for name in names} == {
        "agentrl",
        f"agentrl-{PYPROJECT['project']['version']}.dist-info",
    }
    assert _dist_info(wheel, "top_level.txt").split() == ["agentrl"]


def test_the_wheel_carries_the_license_and_the_entry_point(wheel):
    assert _dist_info(wheel, "licenses/LICENSE") == (ROOT / "LICENSE").read_text()
    assert "agentrl = agentrl.cli:main" in _dist_info(wheel, "entry_points.txt")
    metadata = email.message_from_string(_dist_info(wheel, "METADATA"))
    assert metadata["License-Expression"] == PYPROJECT["project"]["license"]
    assert SpecifierSet(metadata["Requires-Python"]) == SpecifierSet(
        PYPROJECT["project"]["requires-python"]
    )


def test_the_python_classifiers_are_the_versions_requires_python_allows():
    project = PYPROJECT["project"]
    allowed = SpecifierSet(project["requires-python"])
    classified = {
        c.removeprefix(PYTHON_CLASSIFIER)
        for c in project["classifiers"]
        if c.startswith(PYTHON_CLASSIFIER) and c.removeprefix(PYTHON_CLASSIFIER)[:2] == "3."
    }
    assert classified == {f"3.{minor}" for minor in range(8, 20) if f"3.{minor}" in allowed}
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in allowed


def test_every_package_directory_is_declared():
    config = PYPROJECT["tool"]["setuptools"]
    declared = set(config["packages"])
    mapping = config["package-dir"]
    found = set()
    for package, directory in mapping.items():
        base = ROOT / directory
        for init in base.rglob("__init__.py"):
            relative = init.parent.relative_to(base).parts
            found.add(".".join((package, *relative)))
    assert found <= declared, f"undeclared packages: {sorted(found - declared)}"


def test_test_modules_have_unique_basenames():
    # Test folders without __init__.py are imported by basename, so those must not collide.
    names = [
        p.name
        for p in (ROOT / "tests").rglob("test_*.py")
        if not (p.parent / "__init__.py").exists()
    ]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
