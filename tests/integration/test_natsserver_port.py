"""A nats-server's port picked long before its start (a cluster's later servers) may be taken
by then - by any connection's ephemeral port. A port the server chose for itself and never
listened on is chosen again; a port it was given, or one it listened on (clients know it),
never is."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from gavel.transport.natscluster import NatsCluster
from gavel.transport.natsserver import NatsServer, NatsServerError

pytestmark = pytest.mark.integration


def _taken(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_a_chosen_port_taken_before_the_start_is_chosen_again(tmp_path: Path) -> None:
    server = NatsServer(store_dir=tmp_path / "js", log=tmp_path / "nats.log")
    first = server.port
    with _taken(first):
        server.start()
        try:
            assert server.port != first
            with socket.create_connection(("127.0.0.1", server.port), timeout=2):
                pass
        finally:
            server.stop()


def test_a_given_port_or_one_listened_on_is_never_changed(tmp_path: Path) -> None:
    given = NatsServer(store_dir=tmp_path / "js1", log=tmp_path / "n1.log")
    port = given.port
    given.start()
    given.stop()
    with _taken(port), pytest.raises(NatsServerError, match="address already in use"):
        given.start()  # clients were told this port: a restart keeps it or fails
    assert given.port == port
    told = NatsServer(port=port, store_dir=tmp_path / "js2", log=tmp_path / "n2.log")
    with _taken(port), pytest.raises(NatsServerError, match="address already in use"):
        told.start()


def test_a_cluster_port_taken_before_a_later_server_starts_is_chosen_again(
        tmp_path: Path) -> None:
    cluster = NatsCluster(tmp_path / "nats", 3)
    try:
        cluster.start_one(0)
        taken = cluster.cluster_ports[1]
        with _taken(taken):
            cluster.start_one(1)
            cluster.start_one(2)
        assert cluster.cluster_ports[1] != taken
        asyncio.run(cluster.wait_jetstream())  # the three formed one cluster
    finally:
        cluster.stop()
