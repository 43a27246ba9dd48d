"""`gavel up --ha`: what changes when the local cluster runs with several brokers.

Rules:
1. NATS is a cluster of `SERVERS` nats-servers from the wheel on free loopback ports
   (`transport.natscluster`: routes between them, JetStream on, a store each under
   ``STATE/nats-ha``), each with the same ``authorization`` as a lone server would have.
2. The state lives in a bare repository, ``STATE/remote.git``, made once and refusing
   non-fast-forward pushes; every broker pushes there (``--push``) and keeps a working copy
   of its own under ``STATE/brokers/<id>``.
3. `BROKERS` brokers run ``gavel broker --ha`` with ids ``broker-1``...; the lease bucket
   and the node.json mirror are kept at `SERVERS` replicas. With ``--metrics-port P`` the
   k-th broker serves its metrics on P + k - 1.
4. Losing one part the design survives is not the end of the cluster: a broker that exits
   is said once while another still runs, a nats-server that exits is said once while a
   majority of them runs. Losing every broker, or the majority of the servers, stops
   everything (`gavel.cli.up` rule 2), as any other child's exit does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pygit2

from gavel.transport.natscluster import NatsCluster

__all__ = ["BROKERS", "SERVERS", "HaUp"]

SERVERS = 3
BROKERS = 3


@dataclass
class HaUp:
    state: Path
    #: The `authorization` config text every server holds ("" for --no-auth).
    auth: str = ""
    cluster: NatsCluster = field(init=False)
    remote: Path = field(init=False)
    #: The brokers and servers already said to have exited (rule 4).
    _said: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.cluster = NatsCluster(self.state / "nats-ha", SERVERS, extra=self.auth)
        self.remote = self.state / "remote.git"

    def make_remote(self) -> None:
        """Rule 2 (an existing remote is kept as it is: `gavel up --ha` again resumes)."""
        if (self.remote / "HEAD").exists():
            return
        repo = pygit2.init_repository(str(self.remote), bare=True, initial_head="main")
        repo.config["receive.denyNonFastForwards"] = True

    def broker_args(self, k: int, creds: list[str], metrics_port: int | None,
                    metrics_addr: str) -> list[str]:
        """Rule 3: the k-th broker's command line (k from 1)."""
        args = ["broker", "--state", str(self.state / "brokers" / f"broker-{k}"),
                "--push", str(self.remote), "--ha", "--broker-id", f"broker-{k}",
                "--ha-replicas", str(SERVERS), *creds]
        if metrics_port is not None:
            args += ["--metrics-port", str(metrics_port + k - 1), "--metrics-addr",
                     metrics_addr]
        return args

    def losses(self, brokers: dict[str, int | None]) -> tuple[list[str], str]:
        """Rule 4, from each broker's exit status (None: running) and the servers': the
        sentences to say now, and why the whole cluster must stop ("" to carry on)."""
        say = []
        for name, code in brokers.items():
            if code is not None and name not in self._said:
                self._said.add(name)
                say.append(f"gavel up: {name} exited with status {code}; another broker "
                           "leads or takes over")
        dead = [f"nats-server {i + 1}" for i, s in enumerate(self.cluster.servers)
                if s.proc is None or s.proc.poll() is not None]
        for name in dead:
            if name not in self._said:
                self._said.add(name)
                say.append(f"gavel up: {name} of {SERVERS} exited; the others carry on "
                           f"(its log is {self.cluster.servers[int(name[-1]) - 1].log})")
        if all(code is not None for code in brokers.values()):
            return say, "every broker exited; their logs are under " \
                f"{self.state / 'logs'}"
        if len(dead) > SERVERS // 2:
            return say, (f"{len(dead)} of the {SERVERS} nats-servers exited: the cluster has "
                         f"no majority; their logs are under {self.cluster.root}")
        return say, ""
