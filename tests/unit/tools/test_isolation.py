"""Sandbox isolation: the wrapper command lines and what each level says it leaves open."""

from __future__ import annotations

import pytest

from agentrl.tools.isolation import Isolation, IsolationInfo, wrap_command

PY = ["/usr/bin/python3", "-c", "pass"]


def test_bwrap_as_root_drops_to_an_unprivileged_uid_in_its_own_user_namespace() -> None:
    info = IsolationInfo(Isolation.BWRAP, run_as_uid=65534, user_namespace=True)
    argv = wrap_command(info, PY, ro_binds=("/opt/py/3.11", "/usr/local/venv"), tmpfs_bytes=1000)
    sep = argv.index("--")
    bwrap, inner = argv[:sep], argv[sep + 1 :]
    assert bwrap[0] == "bwrap" and "--unshare-net" in bwrap and "--unshare-pid" in bwrap
    assert "--unshare-all" not in bwrap  # a bwrap user namespace would map the uid back to root
    assert "--die-with-parent" in bwrap
    joined = " ".join(bwrap)
    assert "--ro-bind /opt/py/3.11 /opt/py/3.11" in joined
    assert "/usr/local/venv" not in joined  # already inside the /usr bind
    assert "--perms 0755 --dir /opt --perms 0755 --dir /opt/py" in joined
    # The private /tmp is mounted before the binds, so a bind below /tmp lands on top of it.
    tmpfs = joined.index("--size 1000 --perms 1777 --tmpfs /tmp")
    assert tmpfs < joined.index("--ro-bind /opt/py/3.11")
    assert joined.endswith("--chdir /tmp")
    assert inner[:3] == ["setpriv", "--reuid", "65534"]
    assert inner[inner.index("unshare") : inner.index("unshare") + 3] == [
        "unshare",
        "--user",
        "--map-current-user",
    ]
    assert inner[-3:] == PY


def test_unprivileged_caller_gets_the_user_namespace_from_the_wrapper() -> None:
    bwrap = wrap_command(IsolationInfo(Isolation.BWRAP, None, True), PY)
    assert "--unshare-all" in bwrap and "setpriv" not in bwrap
    unshare = wrap_command(IsolationInfo(Isolation.UNSHARE, None, True), PY)
    assert unshare[:2] == ["unshare", "--map-current-user"] and "--net" in unshare
    assert wrap_command(IsolationInfo(Isolation.PROCESS, None, False), PY) == PY


@pytest.mark.parametrize(
    ("info", "gaps"),
    [
        (IsolationInfo(Isolation.BWRAP, 65534, True), []),
        (IsolationInfo(Isolation.UNSHARE, 65534, True), ["filesystem"]),
        (IsolationInfo(Isolation.UNSHARE, 65534, False), ["filesystem", "process limit"]),
        (IsolationInfo(Isolation.PROCESS, 65534, True), ["network", "processes", "filesystem"]),
    ],
)
def test_each_level_names_what_it_does_not_isolate(info: IsolationInfo, gaps: list[str]) -> None:
    assert [gap.split(":")[0] for gap in info.not_isolated()] == gaps
    assert info.describe().startswith(f"sandbox isolation: {info.level.value}")
    assert info.process_limit == ("per-sandbox" if info.user_namespace else "shared")
