"""`gavel auth init`'s files and `--creds` reading, without a server (tests/integration/
test_auth.py runs them against a real one).

What must hold: seeds are 0600 and never rewritten; the config authorizes exactly the node
seeds in the directory; the credential kind is read from the content; a missing or foreign
credential file is one sentence and exit 2 for every command; compose's nats.conf grants
nobody anything but what `auth init` writes, and every compose service holds its own seed.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from gavel.cli.main import main
from gavel.transport import identity as auth
from gavel.transport.creds import CredsError, connect_options
from gavel.transport.identity import IdentityError

ROOT = Path(__file__).resolve().parents[2]
JWT_CREDS = """-----BEGIN NATS USER JWT-----
eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.e30.c2ln
------END NATS USER JWT------

************************* IMPORTANT *************************
NKEY Seed printed below can be used to sign and prove identity.

-----BEGIN USER NKEY SEED-----
{seed}
------END USER NKEY SEED------
"""


def test_init_writes_private_seeds_and_a_config_naming_each(tmp_path: Path) -> None:
    ids = auth.init(tmp_path, ["a", "b"])
    assert ids.directory == tmp_path / "auth"
    assert set(ids.nodes) == {"a", "b"}
    for seed in (ids.broker, ids.operator, *ids.nodes.values()):
        assert stat.S_IMODE(seed.stat().st_mode) == 0o600
        assert re.fullmatch(r"SU[A-Z2-7]{56}\n", seed.read_text())
    conf = ids.config.read_text()
    for who in (ids.broker, ids.operator, *ids.nodes.values()):
        assert auth.public_key(who.read_text().strip()) in conf
    assert "# node a" in conf and '"gavel.bids.a"' in conf and '"_INBOX_a.>"' in conf
    for who in (ids.broker, ids.operator, *ids.nodes.values()):
        assert who.read_text().strip() not in conf  # public keys only, never a seed


def test_init_is_idempotent_and_revocation_is_deleting_a_seed(tmp_path: Path) -> None:
    first = auth.init(tmp_path, ["a", "b"])
    seeds = {p: p.read_text() for p in first.directory.glob("*.nk")}
    conf = first.config.read_text()
    again = auth.init(tmp_path, ["a", "b"])
    assert {p: p.read_text() for p in again.directory.glob("*.nk")} == seeds
    assert again.config.read_text() == conf
    # A node added later joins; the ones already there stay.
    more = auth.init(tmp_path, ["c"])
    assert set(more.nodes) == {"a", "b", "c"}
    # Deleting a seed and running init again takes the node out.
    b_key = auth.public_key(more.nodes["b"].read_text().strip())
    more.nodes["b"].unlink()
    after = auth.init(tmp_path)
    assert set(after.nodes) == {"a", "c"} and b_key not in after.config.read_text()


def test_init_makes_nodes_only_from_the_names_it_is_given(tmp_path: Path) -> None:
    """A seed file dropped into the key directory (a valid one of its own, or a node's seed
    copied under another name) is no node: the config names only what `init` was given."""
    stranger = auth.init(tmp_path / "elsewhere", ["evil"]).nodes["evil"]
    ids = auth.init(tmp_path, ["a"])
    (ids.directory / "evil.nk").write_text(stranger.read_text())
    (ids.directory / "a-copy.nk").write_text(ids.nodes["a"].read_text())
    again = auth.init(tmp_path, ["b"])
    assert set(again.nodes) == {"a", "b"}
    conf = again.config.read_text()
    assert auth.public_key(stranger.read_text().strip()) not in conf
    assert "# node evil" not in conf and "# node a-copy" not in conf
    assert auth.init(tmp_path).nodes.keys() == {"a", "b"}
    # A name written into the record by hand that is no node id is ignored.
    (ids.directory / auth.NODES_RECORD).write_text("a\nb\n../x\nbroker\n")
    assert set(auth.init(tmp_path).nodes) == {"a", "b"}


def test_init_refuses_reserved_names_and_keeps_a_damaged_seed(tmp_path: Path) -> None:
    with pytest.raises(IdentityError, match="reserved"):
        auth.init(tmp_path, ["broker"])
    ids = auth.init(tmp_path, ["a"])
    seed = ids.nodes["a"].read_text().strip()
    # Change a middle character: all five of its bits are data, so the checksum breaks (the
    # last character carries padding bits, and changing only those decodes the same bytes).
    damaged = seed[:10] + ("A" if seed[10] != "A" else "B") + seed[11:]
    ids.nodes["a"].write_text(damaged + "\n")
    with pytest.raises(IdentityError, match="not an nkey user seed"):
        auth.init(tmp_path, ["a"])
    assert ids.nodes["a"].read_text() == damaged + "\n"  # never overwritten


def test_creds_kind_is_read_from_the_content(tmp_path: Path) -> None:
    ids = auth.init(tmp_path, ["a"])
    seed_file = str(ids.nodes["a"])
    assert connect_options(seed_file) == {"nkeys_seed": seed_file}
    creds = tmp_path / "user.creds"
    creds.write_text(JWT_CREDS.format(seed=ids.nodes["a"].read_text().strip()))
    assert connect_options(str(creds)) == {"user_credentials": str(creds)}
    named_like_creds = tmp_path / "seed.creds"  # the name says nothing
    named_like_creds.write_text(ids.nodes["a"].read_text())
    assert connect_options(str(named_like_creds)) == {"nkeys_seed": str(named_like_creds)}
    junk = tmp_path / "junk"
    junk.write_bytes(b"\xff\xfenot a key")
    with pytest.raises(CredsError, match=r"neither a NATS \.creds file nor an nkey"):
        connect_options(str(junk))
    with pytest.raises(CredsError, match="cannot read the credentials file"):
        connect_options(str(tmp_path / "missing.nk"))


@pytest.mark.parametrize("argv", [
    ["status"],
    ["nodes"],
    ["submit", "spec.toml"],
    ["worker", "--node-id", "a", "--check"],
    ["broker", "--state", "s", "--check"],
])
def test_a_missing_creds_file_is_one_sentence_and_exit_2(
        argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.toml").write_text('name = "x"\ncommand = ["true"]\n')
    missing = str(tmp_path / "nope.nk")
    monkeypatch.setenv("GAVEL_CREDS", missing)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cannot read the credentials file" in err and missing in err
    monkeypatch.delenv("GAVEL_CREDS")
    assert main([*argv, "--creds", missing]) == 2


def test_auth_init_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["auth", "init", "--state", str(tmp_path), "--nodes", "2"]) == 0
    assert {p.name for p in (tmp_path / "auth").glob("*.nk")} == {
        "broker.nk", "operator.nk", "node-1.nk", "node-2.nk"}
    assert main(["auth", "init", "--state", str(tmp_path), "--node-ids", "x,y"]) == 0
    out = capsys.readouterr().out
    assert "node x: --creds" in out and "node node-1: --creds" in out
    with pytest.raises(SystemExit) as exc:
        main(["auth", "init", "--state", str(tmp_path), "--node-ids", "a.b"])
    assert exc.value.code == 2
    assert main(["auth", "init", "--state", str(tmp_path), "--node-ids", "operator"]) == 2


def test_compose_grants_each_user_what_auth_init_grants_its_role() -> None:
    """compose/nats.conf has no users of its own: its only authorization is the file
    `gavel auth init` writes (compose/setup), and each gavel service of both compose files
    mounts the seed of its own role, so the composed cluster's identities are `gavel up`'s."""
    import yaml

    text = (ROOT / "compose" / "nats.conf").read_text()
    lines = [line.split("#")[0] for line in text.splitlines()]
    assert 'include "auth/nats.conf"' in lines
    assert not any(w in "".join(lines) for w in ("authorization", "user", "password", "nkey"))
    for name in ("compose.yaml", "compose.ha.yaml"):
        services = yaml.safe_load((ROOT / "compose" / name).read_text())["services"]
        for service, spec in services.items():
            seeds = [v.split(":")[0] for v in spec.get("volumes", []) if v.endswith(".nk:ro")]
            command = spec.get("command", [""])[0]
            own = {"broker": "broker", "gateway": "operator", "worker": service}.get(command)
            assert seeds == ([f"./auth/{own}.nk"] if own else []), (name, service)
            if "nats-server" in spec.get("entrypoint", []):
                assert "./auth/nats.conf:/etc/nats/auth/nats.conf:ro" in spec["volumes"]


def test_the_broker_answers_only_inboxes_and_a_node_reads_only_its_own_key() -> None:
    """The permission lists themselves (tests/integration/test_auth.py puts them to a real
    server): no wildcard grant for the broker, a reply inbox per known node, and of
    JetStream only the event history's, the bucket's creation, nodes' watches and the
    heartbeat stream's own calls for the broker, none for a node."""
    broker = auth.broker_permissions(["a", "b"])
    assert ">" not in broker["publish"]["allow"] and ">" not in broker["subscribe"]["allow"]
    assert {"_INBOX.>", "_INBOX_a.>", "_INBOX_b.>", "_INBOX_broker.>"} <= set(
        broker["publish"]["allow"])
    assert [s for s in broker["publish"]["allow"] if s.startswith("$JS.")] == [
        # the event history (transport.eventstream): made, kept in line, read at start
        "$JS.API.STREAM.CREATE.gavel-events", "$JS.API.STREAM.UPDATE.gavel-events",
        "$JS.API.STREAM.INFO.gavel-events", "$JS.API.STREAM.MSG.GET.gavel-events",
        # nodes' watches: a consumer of one node's key, delivering where the broker says
        # (`broker.watches`), and deleting one
        "$JS.API.CONSUMER.CREATE.KV_gavel-nodes.*.$KV.gavel-nodes.*",
        "$JS.API.CONSUMER.DELETE.KV_gavel-nodes.*",
        "$JS.API.STREAM.CREATE.KV_gavel-nodes",
        # the leadership lease of several brokers: its bucket, reading its one key's last
        # message (did a refused retry land?) and a watch of that key
        "$JS.API.STREAM.CREATE.KV_gavel-leader", "$JS.API.STREAM.MSG.GET.KV_gavel-leader",
        "$JS.API.CONSUMER.CREATE.KV_gavel-leader.*.$KV.gavel-leader.leader",
        # the heartbeat stream's (broker.heartbeat_stream), on that stream only
        "$JS.API.STREAM.CREATE.gavel-heartbeats", "$JS.API.STREAM.UPDATE.gavel-heartbeats",
        "$JS.API.STREAM.PURGE.gavel-heartbeats", "$JS.API.CONSUMER.CREATE.gavel-heartbeats.*",
        "$JS.API.CONSUMER.MSG.NEXT.gavel-heartbeats.*",
        "$JS.API.CONSUMER.DELETE.gavel-heartbeats.*"]
    assert [s for s in broker["publish"]["allow"] if s.startswith("$KV.")] == [
        "$KV.gavel-nodes.*", "$KV.gavel-leader.leader"]
    node = auth.worker_permissions("a")
    assert [s for s in node["publish"]["allow"] if s.startswith("$")] == []  # no JetStream
    assert "gavel.watch.a" in node["publish"]["allow"]
    ids_conf = auth.render_config([("broker", "UKEY", broker)])
    assert "allow_responses" not in ids_conf


def test_an_operator_s_http_token_is_written_once_private_and_read_with_its_role(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`gavel auth operator add NAME --http-token` (`cli.api.operators` rule 1); `gavel api
    --api-operators` reads each recorded operator with a token and a seed (rule 2)."""
    from gavel.cli.api import operators
    from gavel.cli.auth import run_cli
    from gavel.cli.main import build_parser

    def add(*argv: str) -> None:
        assert run_cli(build_parser().parse_args(
            ["auth", "operator", "add", *argv, "--state", str(tmp_path)])) == 0
    add("ci", "--role", "write", "--http-token")
    add("viewer", "--role", "read")  # no token: not the API's
    path = tmp_path / "auth" / "operators" / "ci.token"
    token = path.read_text().strip()
    assert len(token) >= 32 and path.stat().st_mode & 0o077 == 0
    assert f"its HTTP API token: {path.resolve()}" in capsys.readouterr().out
    add("ci", "--role", "read", "--http-token")  # re-roled: the token is kept
    assert path.read_text().strip() == token
    assert operators.load(tmp_path / "auth") == [operators.Operator(
        name="ci", role="read", creds=tmp_path / "auth" / "operators" / "ci.nk", token=token)]
