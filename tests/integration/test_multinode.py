"""A training job across a 2-node Ray cluster started on this machine.

Two ``ray start`` processes (a head and a worker with a ``node2`` resource, 1 CPU each,
their own temp dirs and ports) form the cluster on loopback; the test joins it with
``ray.address`` and trains the toy task for 2 steps (HF rollout engine, 1 replica, 2 FSDP
ranks of 1 CPU each). Placement must put one rank on each node, in per-node STRICT_PACK
placement groups.

The nodes bind 127.0.0.2: Ray replaces 127.0.0.1 with the machine's routable address, but
keeps any other loopback address. The cluster is stopped by signalling the two
``ray start --block`` processes this test started (``ray stop`` would stop every Ray
instance on the machine, including other test runs').
"""

from __future__ import annotations

import itertools
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
from pathlib import Path

import pytest
import ray
from ray import serve
from toy_task import toy_config

from agentrl.placement import PlacementError, TrainerPlacementConfig, place_ranks
from agentrl.trainer.trainer import Trainer

pytestmark = pytest.mark.integration

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


def _free_port() -> int:
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
    return [f"--{name}={_free_port()}" for name in names]


class LocalCluster:
    """A head and one worker node, each a ``ray start --block`` child process."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = _free_port()
        self.address = f"{NODE_IP}:{self.port}"
        self.env = dict(os.environ, RAY_AUTH_MODE="token")
        self.processes: list[subprocess.Popen] = []

    def start(self, timeout_s: float = 90.0) -> None:
        common = [f"--node-ip-address={NODE_IP}", "--num-cpus=1", "--disable-usage-stats"]
        self._ray_start(
            "head",
            "--head",
            f"--port={self.port}",
            "--include-dashboard=false",
            f"--dashboard-port={_free_port()}",
            f"--ray-client-server-port={_free_port()}",
            *common,
        )
        self._wait(lambda: self._healthy(), timeout_s, "head node")
        self._ray_start("node2", f"--address={self.address}", '--resources={"node2": 1}', *common)

    def _ray_start(self, name: str, *args: str) -> None:
        temp_dir = self.root / name
        temp_dir.mkdir(parents=True, exist_ok=True)
        command = [str(RAY), "start", "--block", f"--temp-dir={temp_dir}", *args, *_node_ports()]
        with (self.root / f"{name}.log").open("w") as log:
            self.processes.append(
                subprocess.Popen(
                    command,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def _check_alive(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                raise RuntimeError(f"`ray start` exited with {process.returncode}")

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

    @staticmethod
    def _wait(ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not up after {timeout_s:.0f}s")
            time.sleep(0.5)

    def connect(self, timeout_s: float = 60.0) -> None:
        """Join the cluster as its driver and wait until both nodes are alive in it."""
        ray.init(address=self.address, namespace="agentrl", log_to_driver=False)

        def both_alive() -> bool:
            self._check_alive()
            return len([n for n in ray.nodes() if n["Alive"]]) >= 2

        self._wait(both_alive, timeout_s, "nodes")

    def stop(self) -> None:
        """SIGTERM each ``ray start --block`` (it stops its node), then kill what is left."""
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)  # its own session: only its children
                process.wait(timeout=10)


def _start_cluster(attempts: int = 2) -> LocalCluster:
    """Start the two nodes; a start-up failure is retried once on new ports and temp dirs
    (the cluster is this test's scaffolding, not what it tests), with a warning that quotes
    the failed nodes' output."""
    for attempt in itertools.count(1):
        # Short: Ray's socket paths under the temp dir must stay within 107 bytes.
        local = LocalCluster(Path(tempfile.mkdtemp(prefix="agentrl-ray-")))
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


@pytest.fixture(scope="module")
def cluster():
    if not RAY.exists():
        pytest.skip(f"no `ray` CLI next to {sys.executable}")
    # Token authentication, as Ray now defaults to: nodes and driver use ~/.ray/auth_token
    # (created here if no local Ray has made one yet). The driver's Ray config is reloaded,
    # since it may have been read before (a disabled driver cannot talk to token nodes).
    subprocess.run([str(RAY), "get-auth-token", "--generate"], capture_output=True, check=True)
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_AUTH_MODE", "token")
    ray._raylet.Config.initialize("")
    ray.shutdown()  # an earlier module's local instance, if any
    local = _start_cluster()
    try:
        yield local
    finally:
        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
        local.stop()
        mp.undo()
        shutil.rmtree(local.root, ignore_errors=True)


def _node_of(actor: ray.actor.ActorHandle) -> str:
    return ray.get(actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))


@pytest.mark.asyncio(loop_scope="module")
async def test_training_job_spreads_fsdp_ranks_over_both_nodes(
    cluster, tiny_checkpoint, tmp_path_factory
):
    tmp = tmp_path_factory.mktemp("multinode")
    cfg = toy_config(
        tiny_checkpoint,
        tmp,
        steps=2,
        extra=[
            f"ray.address={cluster.address}",
            "server.engine.backend=hf",
            f"server.http_port={_free_port()}",
            "workers.actor.num_cpus_per_worker=1",
            # Small: 2 rows x 2 samples of <= 16 tokens per step, one mini-batch.
            "data.train_batch_size=2",
            "rollout.n=2",
            "rollout.max_response_length=16",
            "workers.actor.mini_batch_size=4",
        ],
    )
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    trainer = Trainer(cfg)
    trainer.setup()
    try:
        placement = trainer.actor.placement
        bundle_nodes = placement.node_ids()
        rank_nodes = [_node_of(actor) for actor in trainer.actor.actors]
        history = await trainer.fit()
    finally:
        trainer.shutdown()
    # One 1-rank STRICT_PACK group per node (each node has 1 CPU); each rank ran on the
    # node its bundle reserved.
    assert placement.sizes == [1, 1]
    assert set(rank_nodes) == nodes
    assert rank_nodes == bundle_nodes
    assert [h["trainer/version"] for h in history] == [1, 2]
    assert (tmp / "run" / "metrics.jsonl").read_text().count("\n") == 2


def test_node_resource_pins_a_rank_to_the_nodes_that_have_it(cluster):
    config = TrainerPlacementConfig(node_resource="node2", ranks_per_node=1)
    placement = place_ranks(1, 0, 0, config, name="pinned")
    try:
        (node,) = placement.node_ids()
    finally:
        placement.remove()
    (node2,) = [n["NodeID"] for n in ray.nodes() if n["Alive"] and "node2" in n["Resources"]]
    assert node == node2


def test_ranks_the_cluster_cannot_hold_fail_with_the_missing_resources(cluster):
    config = TrainerPlacementConfig(ready_timeout_s=2, ranks_per_node=2)
    with pytest.raises(PlacementError, match=r"not ready after 2s.*'CPU': 1\.0"):
        place_ranks(2, 1, 0, config, name="too-big")
    # The failed groups were removed: both CPUs are free again.
    LocalCluster._wait(lambda: ray.available_resources().get("CPU", 0) == 2, 10, "free CPUs")
