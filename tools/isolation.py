"""How sandboxed code is isolated on this machine, and the command line that does it.

Three levels, strongest first; ``detect_isolation`` probes them once and
picks the first that works:

- ``bwrap`` (bubblewrap): new mount, pid, network, IPC and UTS namespaces;
  only ``/usr``, ``/lib``, ``/lib64``, ``/bin`` and the interpreter's prefix
  are visible, read-only; private ``/proc`` and ``/dev``; the working
  directory is a size-limited tmpfs at ``/tmp``.
- ``unshare`` (util-linux): new pid, network, IPC and UTS namespaces and a
  private ``/proc``; the host filesystem stays visible.
- ``process``: resource limits and a process group only.

When agentrl runs as root, the code is started as an unprivileged uid
(``setpriv``), because the kernel does not enforce ``RLIMIT_NPROC`` for root,
and inside a fresh user namespace (``unshare --user``), where the kernel counts
processes per namespace, so the process limit holds per sandbox. A non-root
caller gets the user namespace from bwrap or unshare directly.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePosixPath

__all__ = ["Isolation", "IsolationInfo", "detect_isolation", "interpreter_binds", "wrap_command"]

SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/bin")
"""Host directories bound read-only into a bubblewrap sandbox."""

SANDBOX_WORKDIR = "/tmp"
"""The working directory inside a bubblewrap sandbox (a private tmpfs)."""

_PROBE_TIMEOUT_S = 20.0


class Isolation(StrEnum):
    """Isolation levels, strongest first."""

    BWRAP = "bwrap"
    UNSHARE = "unshare"
    PROCESS = "process"


@dataclass(frozen=True)
class IsolationInfo:
    """One way of running sandboxed code, and what it does and does not isolate.

    Attributes:
        level: the namespace wrapper in use.
        run_as_uid: the unprivileged uid the code runs as (we are root and drop
            to it), or ``None`` when it runs as the caller's own uid.
        user_namespace: the code runs in its own user namespace, so the
            process-count limit is counted per sandbox.
    """

    level: Isolation
    run_as_uid: int | None
    user_namespace: bool

    @property
    def network_isolated(self) -> bool:
        """No network at all, not even loopback (own network namespace)."""
        return self.level is not Isolation.PROCESS

    @property
    def filesystem_isolated(self) -> bool:
        """Host files are hidden or read-only; writes land in a size-limited tmpfs."""
        return self.level is Isolation.BWRAP

    @property
    def pid_namespace(self) -> bool:
        """Host processes are invisible and everything dies with the sandbox."""
        return self.level is not Isolation.PROCESS

    @property
    def process_limit(self) -> str:
        """How ``RLIMIT_NPROC`` holds: ``per-sandbox``, ``shared`` (per uid) or ``none``."""
        if self.run_as_uid is None and os.geteuid() == 0:
            return "none"  # the kernel does not enforce it for root
        if self.user_namespace:
            return "per-sandbox"
        return "shared" if self.run_as_uid is not None else "none"

    def not_isolated(self) -> list[str]:
        """What this level leaves open, in plain words (empty when nothing known)."""
        gaps = []
        if not self.network_isolated:
            gaps.append("network: the code can open sockets and reach the host and the internet")
        if not self.pid_namespace:
            gaps.append(
                "processes: the code sees host processes and may signal those of its own uid; "
                "children that leave the process group can outlive the run"
            )
        if not self.filesystem_isolated:
            gaps.append(
                "filesystem: the host filesystem is visible; the code can read what its uid can "
                "read and write where its uid can write (e.g. /tmp); disk use is bounded only "
                "per file (RLIMIT_FSIZE) and by the time limit"
            )
        if self.run_as_uid is None and os.geteuid() == 0:
            gaps.append("privileges: the code runs as root")
        if self.process_limit == "shared":
            gaps.append("process limit: shared by all sandboxes running as the same uid")
        elif self.process_limit == "none":
            gaps.append(
                "process limit: none (not enforced for root; for another uid RLIMIT_NPROC "
                "would count all of the caller's tasks)"
            )
        return gaps

    def describe(self) -> str:
        """One paragraph for logs and README: the level and its gaps."""
        who = f"uid {self.run_as_uid}" if self.run_as_uid is not None else "the caller's uid"
        userns = ", own user namespace" if self.user_namespace else ""
        text = f"sandbox isolation: {self.level.value} (runs as {who}{userns})"
        gaps = self.not_isolated()
        return text + ("; not isolated: " + "; ".join(gaps) if gaps else "; fully isolated")


def wrap_command(
    info: IsolationInfo,
    argv: Sequence[str],
    *,
    ro_binds: Sequence[str] = (),
    tmpfs_bytes: int = 64 << 20,
) -> list[str]:
    """The command line that runs ``argv`` under ``info``'s isolation.

    Args:
        info: the isolation to apply.
        argv: the command to run inside (an interpreter and its arguments).
        ro_binds: extra host directories visible read-only (bwrap only), e.g. the
            interpreter's prefix; those under a system directory are skipped.
        tmpfs_bytes: size of the private ``/tmp`` working directory (bwrap only).
    """
    inner = list(argv)
    if info.user_namespace and info.run_as_uid is not None:
        inner = ["unshare", "--user", "--map-current-user", *inner]
    if info.run_as_uid is not None:
        uid = str(info.run_as_uid)
        inner = [
            "setpriv", "--reuid", uid, "--regid", uid, "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", *inner,
        ]  # fmt: skip
    if info.level is Isolation.BWRAP:
        return [*_bwrap_prefix(info, ro_binds, tmpfs_bytes), "--", *inner]
    if info.level is Isolation.UNSHARE:
        userns = ["--map-current-user"] if info.run_as_uid is None else []
        namespaces = ["--net", "--pid", "--ipc", "--uts", "--fork", "--mount-proc", "--kill-child"]
        # A shell as pid 1: the code gets normal signal handling (pid 1 ignores SIGXCPU), and a
        # signal death comes back as exit status 128 + signal, which unshare cannot pass on.
        shell = ["/bin/sh", "-c", '"$@"; exit $?', "sh"]
        return ["unshare", *userns, *namespaces, "--", *shell, *inner]
    return inner


def _bwrap_prefix(info: IsolationInfo, ro_binds: Sequence[str], tmpfs_bytes: int) -> list[str]:
    if info.run_as_uid is None:
        namespaces = ["--unshare-all"]
    else:  # root: no user namespace from bwrap, so that setpriv can drop to another uid
        namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        namespaces.append("--unshare-cgroup-try")
    args = ["bwrap", *namespaces, "--die-with-parent", "--new-session"]
    for path in SYSTEM_DIRS:
        args += ["--ro-bind-try", path, path]
    # The private /tmp first: a bind under /tmp (a venv there, say) must land on top of it,
    # not be hidden by it.
    args += ["--size", str(tmpfs_bytes), "--perms", "1777", "--tmpfs", SANDBOX_WORKDIR]
    made = {SANDBOX_WORKDIR}
    for path in sorted({os.path.realpath(p) for p in ro_binds}):
        if any(PurePosixPath(path).is_relative_to(d) for d in SYSTEM_DIRS):
            continue
        for parent in reversed(PurePosixPath(path).parents[:-1]):
            if str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", path, path]
    args += ["--proc", "/proc", "--dev", "/dev"]
    return [*args, "--chdir", SANDBOX_WORKDIR]


def interpreter_binds(python: str) -> tuple[str, ...]:
    """Host directories the interpreter needs: its prefixes when it is this process's Python."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return tuple(dict.fromkeys((sys.prefix, sys.base_prefix)))
    return ()


@functools.cache
def detect_isolation(
    python: str = sys.executable,
    ro_binds: tuple[str, ...] | None = None,
    sandbox_uid: int = 65534,
    level: Isolation | None = None,
) -> IsolationInfo:
    """The strongest isolation that works here, probed once by running ``python -c pass``.

    Args:
        python: the interpreter the sandbox will run.
        ro_binds: host directories bound read-only under bwrap (default: the
            interpreter's prefixes, see ``interpreter_binds``).
        sandbox_uid: the uid to drop to when running as root.
        level: probe only this level (raises if it does not work here).

    Raises:
        RuntimeError: ``level`` was given and does not work, with the reason.
    """
    binds = interpreter_binds(python) if ro_binds is None else ro_binds
    failures = []
    for info in _candidates(sandbox_uid, level):
        reason = _probe(info, python, binds)
        if reason is None:
            return info
        failures.append(f"{info.level.value} (user namespace={info.user_namespace}): {reason}")
    raise RuntimeError(
        "no sandbox isolation works with python "
        f"{python!r}: " + "; ".join(failures) + ". Install bubblewrap, or set python to an "
        "interpreter the sandbox uid can run (e.g. /usr/bin/python3)."
    )


def _candidates(sandbox_uid: int, level: Isolation | None) -> list[IsolationInfo]:
    levels = [level] if level is not None else list(Isolation)
    if os.geteuid() == 0 and shutil.which("setpriv") is not None:
        return [
            IsolationInfo(lvl, sandbox_uid, userns) for lvl in levels for userns in (True, False)
        ]
    # bwrap and unshare make a user namespace themselves; the process level cannot.
    return [IsolationInfo(lvl, None, lvl is not Isolation.PROCESS) for lvl in levels]


def _probe(info: IsolationInfo, python: str, binds: Sequence[str]) -> str | None:
    tool = {Isolation.BWRAP: "bwrap", Isolation.UNSHARE: "unshare"}.get(info.level)
    if tool is not None and shutil.which(tool) is None:
        return f"{tool} is not installed"
    code = "import sys; print(sys.version, end='')"
    argv = wrap_command(info, [python, "-s", "-B", "-c", code], ro_binds=binds)
    try:
        proc = subprocess.run(
            argv, capture_output=True, timeout=_PROBE_TIMEOUT_S, cwd="/", env={}, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if proc.returncode != 0:
        return proc.stderr.decode(errors="replace").strip()[-300:] or f"exit {proc.returncode}"
    version = proc.stdout.decode(errors="replace")
    if os.path.realpath(python) == os.path.realpath(sys.executable) and version != sys.version:
        # e.g. a venv whose base interpreter the sandbox uid cannot reach
        return f"{python} starts Python {version.split()[0]} there, not {sys.version.split()[0]}"
    return None
