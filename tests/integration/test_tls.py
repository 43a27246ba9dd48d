"""NATS over TLS with client certificates, as docs/deploy.md's TLS section sets it up:
`gavel broker` and `gavel worker` connect with tls:// URLs and --tls-ca/--tls-cert/--tls-key
and place an instance; without a client certificate the server turns a client away."""

from __future__ import annotations

import errno
import shutil
import signal
import socket
import ssl
import subprocess
from pathlib import Path

import nats
import pytest

from gavel.shared.api import StatusReply, StatusRequest, SubmitReply, SubmitRequest
from gavel.transport.client import call
from gavel.transport.natsserver import find_binary, free_port
from tests.integration.harness import gavel_process, wait_for, writer_spec

pytestmark = pytest.mark.integration

#: What nats-server logs when it turns a client away for coming without a certificate.
MISSING_CERT = "TLS handshake error: tls: client didn't provide a certificate"


def make_certs(d: Path) -> None:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=gavel-test-ca")
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"),
                      ("client", "extendedKeyUsage=clientAuth")):
        (d / f"{name}.ext").write_text(ext + "\n")
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
            f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")


async def test_daemons_over_mutual_tls(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not available to make test certificates")
    make_certs(tmp_path)
    port = free_port()
    (tmp_path / "nats.conf").write_text(
        f'listen: "127.0.0.1:{port}"\njetstream {{ store_dir: "{tmp_path / "js"}" }}\n'
        f'tls {{\n  cert_file: "{tmp_path / "server.pem"}"\n'
        f'  key_file: "{tmp_path / "server.key"}"\n  ca_file: "{tmp_path / "ca.pem"}"\n'
        "  verify: true\n}\n")
    server_log = tmp_path / "nats.log"
    with open(server_log, "ab") as out:
        server = subprocess.Popen([find_binary(), "-c", str(tmp_path / "nats.conf")],
                                  stdout=subprocess.DEVNULL, stderr=out)
    procs: list[subprocess.Popen[bytes]] = []
    url = f"tls://127.0.0.1:{port}"
    tls = ["--tls-ca", str(tmp_path / "ca.pem"), "--tls-cert", str(tmp_path / "client.pem"),
           "--tls-key", str(tmp_path / "client.key")]
    try:
        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                return True
            except OSError:
                return False
        await wait_for(listening, 10, what="nats-server with TLS")
        procs.append(gavel_process(["broker", "--state", str(tmp_path / "state"), "--nats",
                                    url, *tls], tmp_path / "broker.log"))
        procs.append(gavel_process(["worker", "--node-id", "w1", "--nats", url, *tls,
                                    "--cpu", "2", "--memory-mb", "1024", "--state",
                                    str(tmp_path / "w1")], tmp_path / "worker.log"))
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        # TLS 1.3: the client's handshake is done before the server checks its certificate;
        # the server's alert then reaches it as the SSL error, or - when its CONNECT was
        # written first - as the reset of the connection the server closed (asyncio's own
        # "Connection lost", or the kernel's ECONNRESET when a write meets it), or - when it
        # writes after the close - as a broken pipe.
        with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)) as refused:
            await nats.connect(url, tls=ctx, connect_timeout=2, allow_reconnect=False,
                               max_reconnect_attempts=0)
        if isinstance(refused.value, ssl.SSLError):
            assert refused.value.reason == "TLSV13_ALERT_CERTIFICATE_REQUIRED", refused.value
        elif isinstance(refused.value, ConnectionResetError):
            assert refused.value.errno == errno.ECONNRESET \
                or str(refused.value) == "Connection lost", refused.value
        # Either way the server says why, and only for this client (the daemons have one).
        await wait_for(lambda: MISSING_CERT in server_log.read_text(), 10,
                       what="the server to name the missing client certificate")
        assert server_log.read_text().count(MISSING_CERT) == 1, server_log.read_text()
        ctx.load_cert_chain(str(tmp_path / "client.pem"), str(tmp_path / "client.key"))
        nc = await nats.connect(url, tls=ctx)
        try:
            out = tmp_path / "out"

            async def submitted() -> str:
                reply = await call(nc, "submit", SubmitRequest(spec=writer_spec(
                    "tls", out, cpu=0.5)), SubmitReply)
                return reply.instance_id

            async def broker_up() -> bool:
                try:
                    await call(nc, "status", StatusRequest(), StatusReply, timeout=1)
                    return True
                except Exception:
                    return False
            await wait_for(broker_up, 20, what="the broker over TLS")
            iid = await submitted()
            await wait_for(lambda: (out / iid).exists(), 20,
                           what="the worker over TLS to run the instance")
        finally:
            await nc.close()
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        server.terminate()
        server.wait(10)
