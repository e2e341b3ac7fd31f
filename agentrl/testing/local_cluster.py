"""A multi-node Ray cluster on this machine: the multi-node and node-loss tests' and the
simulated cluster's nodes (``bench/cluster_sim.py --nodes``).

Each node is a ``ray start --block`` child process in a session of its own, with its own
temp dir and ports, on loopback. The nodes bind 127.0.0.2: Ray replaces 127.0.0.1 with the
machine's routable address, but keeps any other loopback address. The cluster is stopped
by signalling the ``ray start`` processes it started (``ray stop`` would stop every Ray
instance on the machine, including other test runs'). A node is lost whole by SIGKILL of
its process tree: its raylet, object store and every worker on it, as a preempted machine.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import psutil
import ray

NODE_IP = "127.0.0.2"
RAY = Path(sys.executable).with_name("ray")

# Below the kernel's ephemeral range (32768+ by default) and above Ray's worker ports
# (10002-19999): a port picked there cannot be taken by some process's outgoing connection
# between the pick and Ray's bind.
PORT_RANGE = range(20000, 32000)
_taken: set[int] = set()


def _bindable(port: int) -> bool:
    for host in (NODE_IP, "0.0.0.0"):
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                return False
    return True


def free_port() -> int:
    """A port no process binds now and no earlier call of this module returned."""
    while True:
        port = random.choice(PORT_RANGE)
        if port not in _taken and _bindable(port):
            _taken.add(port)
            return port


def _node_ports() -> list[str]:
    names = [
        "node-manager-port",
        "object-manager-port",
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "runtime-env-agent-port",
        "metrics-export-port",
    ]
    return [f"--{name}={free_port()}" for name in names]


def wait_for(ready: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Polls ``ready`` until it is true; TimeoutError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not up after {timeout_s:.0f}s")
        time.sleep(0.5)


class LocalCluster:
    """A head node and worker nodes, each a ``ray start --block`` child process."""

    def __init__(
        self, root: Path, nodes: dict[str, dict[str, float]], cpus: dict[str, int]
    ) -> None:
        """``nodes``: each node's name (``head`` first, then the worker nodes) and custom
        resources (each node also has one unit of a resource named after it); ``cpus``:
        each node's CPUs (1 where not named)."""
        if next(iter(nodes)) != "head":
            raise ValueError("the first node is the head")
        self.root = root
        self.nodes = nodes
        self.workers = [name for name in nodes if name != "head"]
        self.cpus = cpus
        self.port = free_port()
        self.address = f"{NODE_IP}:{self.port}"
        self.env = dict(os.environ, RAY_AUTH_MODE="token")
        self.processes: dict[str, subprocess.Popen] = {}
        self._starts = itertools.count()

    def _common(self, name: str) -> list[str]:
        return [
            f"--node-ip-address={NODE_IP}",
            f"--num-cpus={self.cpus.get(name, 1)}",
            f"--resources={json.dumps({name: 1, **self.nodes[name]})}",
            "--disable-usage-stats",
        ]

    def start(self, timeout_s: float = 90.0) -> None:
        self._ray_start(
            "head",
            "--head",
            f"--port={self.port}",
            "--include-dashboard=false",
            f"--dashboard-port={free_port()}",
            f"--ray-client-server-port={free_port()}",
        )
        wait_for(self._healthy, timeout_s, "head node")
        for name in self.workers:
            self.add_node(name)

    def add_node(self, name: str) -> None:
        """Starts worker node ``name`` (again, after it was lost: new temp dir and ports)."""
        self._ray_start(name, f"--address={self.address}")

    def _ray_start(self, name: str, *args: str) -> None:
        # Short: Ray's socket paths under the temp dir must stay within 107 bytes.
        temp_dir = self.root / f"{name}{next(self._starts)}"
        temp_dir.mkdir(parents=True, exist_ok=True)
        command = [str(RAY), "start", "--block", f"--temp-dir={temp_dir}", *args]
        command += [*self._common(name), *_node_ports()]
        with (self.root / f"{name}.log").open("a") as log:
            self.processes[name] = subprocess.Popen(
                command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def _check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"`ray start` of {name} exited with {process.returncode}")

    def _healthy(self) -> bool:
        """The head's `ray start` is alive and its GCS port accepts connections."""
        self._check_alive()
        with socket.socket() as sock:
            sock.settimeout(1)
            return sock.connect_ex((NODE_IP, self.port)) == 0

    def log_tail(self, lines: int = 60) -> str:
        """The last lines of each node's `ray start` output (it quotes the log of a Ray
        subprocess that died), so a start-up failure on a CI machine says why."""
        tails = []
        for log in sorted(self.root.glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            tails.append(f"--- {log.name} ---\n" + "\n".join(text))
        return "\n".join(tails)

    def alive_nodes(self) -> list[dict]:
        """The nodes the cluster's GCS sees alive."""
        return [n for n in ray.nodes() if n["Alive"]]

    def node_id(self, name: str) -> str:
        """The Ray node id of the alive node ``name`` (by its resource of that name)."""
        (node,) = [n["NodeID"] for n in self.alive_nodes() if name in n["Resources"]]
        return node

    def connect(self, timeout_s: float = 60.0) -> None:
        """Join the cluster as its driver and wait until every node is alive in it."""
        ray.init(address=self.address, namespace="agentrl", log_to_driver=False)
        self.wait_for_nodes(1 + len(self.workers), timeout_s)

    def wait_for_nodes(self, count: int, timeout_s: float = 60.0) -> None:
        """Waits until the GCS sees exactly ``count`` nodes alive."""

        def alive() -> bool:
            self._check_alive()
            return len(self.alive_nodes()) == count

        wait_for(alive, timeout_s, f"{count} alive nodes")

    def kill_node(self, name: str) -> None:
        """Loses worker node ``name`` whole: SIGKILL to its ``ray start`` process, its
        raylet, object store and every worker process on it, at once."""
        process = self.processes.pop(name)
        tree = [process.pid]
        with contextlib.suppress(psutil.NoSuchProcess):
            tree += [child.pid for child in psutil.Process(process.pid).children(recursive=True)]
        os.killpg(process.pid, signal.SIGKILL)  # its own session: only that node's processes
        for pid in tree:  # any that left the session
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM each ``ray start --block`` (it stops its node), then kill what is left."""
        processes = list(self.processes.values())
        for process in reversed(processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)  # its own session: only its children
                process.wait(timeout=10)


def start_cluster(
    nodes: dict[str, dict[str, float]], cpus: dict[str, int], attempts: int = 2
) -> LocalCluster:
    """Start the nodes and join them as the driver; a start-up failure is retried once on
    new ports and temp dirs (the cluster is the tests' scaffolding, not what they test),
    with a warning that quotes the failed nodes' output."""
    for attempt in itertools.count(1):
        local = LocalCluster(Path(tempfile.mkdtemp(prefix="agentrl-ray-")), nodes, cpus)
        try:
            local.start()
            local.connect()
            return local
        except (RuntimeError, TimeoutError, ConnectionError) as error:
            ray.shutdown()
            local.stop()
            failure = f"local Ray cluster did not start (attempt {attempt}): {error}\n"
            failure += local.log_tail()
            shutil.rmtree(local.root, ignore_errors=True)
            if attempt == attempts:
                raise RuntimeError(failure) from error
            warnings.warn(failure, stacklevel=2)
    raise AssertionError("unreachable")


def prepare_token_auth() -> None:
    """Token authentication, as Ray now defaults to for the nodes ``ray start`` runs: makes
    ~/.ray/auth_token if no local Ray has, and has this process read Ray's config again
    (a driver that read it without ``RAY_AUTH_MODE=token``, which the caller sets, cannot
    talk to token nodes)."""
    subprocess.run([str(RAY), "get-auth-token", "--generate"], capture_output=True, check=True)
    ray._raylet.Config.initialize("")
