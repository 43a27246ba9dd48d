"""Hosts on one machine for the partition test: network namespaces, each joined to a bridge
in the root namespace by a veth pair, on a private /24 of their own.

Rules:
1. Every name is this run's own (a random token in every namespace, link and bridge name),
   and so is the subnet (a 10.x.y.0/24 no route of the machine already covers): runs side
   by side, or another engineer's, never meet.
2. Host k (1-based) is namespace ``NAME-k`` with address ``10.x.y.k`` on its end of the
   pair and loopback up; the root namespace is ``10.x.y.254`` on the bridge, so processes
   here (workers, the test's own clients) reach every host.
3. `cut(k)` brings host k's end in the root namespace down: nothing crosses between host k
   and anyone else, while what runs inside host k (its server, its broker) goes on and
   talks to itself on loopback. `heal(k)` brings it up again.
4. `close` deletes every namespace and the bridge (a namespace's veth end goes with it),
   whatever state they are in; it is safe to call twice and after a half-made `open`.
5. `unavailable()` says in one sentence why this machine cannot do this (not root, no
   `ip`, namespaces refused), or "" when it can.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import subprocess
from collections.abc import Sequence

__all__ = ["Hosts", "unavailable"]


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", *(["netns", "exec", ns, "ip"] if ns else []), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=check)


def unavailable() -> str:
    """Rule 5."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    name = f"gvprobe{secrets.token_hex(4)}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    try:
        link = subprocess.run(["ip", "link", "add", f"{name[:9]}a", "type", "veth", "peer",
                               "name", f"{name[:9]}b", "netns", name],
                              capture_output=True, text=True)
        if link.returncode != 0:
            return f"veth pairs cannot be made: {link.stderr.strip()}"
        subprocess.run(["ip", "link", "del", f"{name[:9]}a"], capture_output=True)
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return ""


def _free_subnet() -> ipaddress.IPv4Network:
    """Rule 1: a 10.x.y.0/24 that no route here overlaps."""
    routes = _ip("-4", "route", "show", "table", "all").stdout.split()
    taken = []
    for word in routes:
        try:
            taken.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            continue
    taken = [n for n in taken if isinstance(n, ipaddress.IPv4Network) and n.prefixlen > 0]
    for _ in range(200):
        net = ipaddress.IPv4Network(
            f"10.{100 + secrets.randbelow(150)}.{secrets.randbelow(250)}.0/24")
        if not any(net.overlaps(t) for t in taken):
            return net
    raise RuntimeError("no free 10.x.y.0/24 for the test hosts")


class Hosts:
    def __init__(self, count: int) -> None:
        self.count = count
        self.token = secrets.token_hex(3)
        self.bridge = f"gvb{self.token}"
        self.net = _free_subnet()
        self.root_addr = str(self.net.network_address + 254)
        self._made: list[str] = []

    def name(self, k: int) -> str:
        return f"gavel-{self.token}-{k}"

    def addr(self, k: int) -> str:
        return str(self.net.network_address + k)

    def _root_end(self, k: int) -> str:
        return f"gv{self.token}h{k}"

    def open(self) -> Hosts:
        """Rule 2."""
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.append("bridge")
        _ip("addr", "add", f"{self.root_addr}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for k in range(1, self.count + 1):
            ns = self.name(k)
            _ip("netns", "add", ns)
            self._made.append(ns)
            inner = f"gv{self.token}n{k}"
            _ip("link", "add", self._root_end(k), "type", "veth", "peer", "name", inner,
                "netns", ns)
            _ip("link", "set", self._root_end(k), "master", self.bridge)
            _ip("link", "set", self._root_end(k), "up")
            _ip("link", "set", "lo", "up", ns=ns)
            _ip("addr", "add", f"{self.addr(k)}/24", "dev", inner, ns=ns)
            _ip("link", "set", inner, "up", ns=ns)
        return self

    def command(self, k: int, argv: Sequence[str]) -> list[str]:
        """`argv` run inside host k (``ip netns exec`` execs it: the pid is the command's)."""
        return ["ip", "netns", "exec", self.name(k), *argv]

    def cut(self, k: int) -> None:
        """Rule 3."""
        _ip("link", "set", self._root_end(k), "down")

    def heal(self, k: int) -> None:
        _ip("link", "set", self._root_end(k), "up")

    def close(self) -> None:
        """Rule 4."""
        for made in reversed(self._made):
            if made == "bridge":
                _ip("link", "del", self.bridge, check=False)
            else:
                _ip("netns", "del", made, check=False)
        self._made.clear()
