"""Every Python package in the repository is declared in pyproject.toml."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_directory_is_declared():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
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
