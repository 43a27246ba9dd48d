"""Who may read the dashboard (`gavel.cli.ui.access`): loopback needs no token, any other
address does, and a request proves it holds the token by cookie, bearer header or query."""

from __future__ import annotations

import pytest

from gavel.cli.ui import access


@pytest.mark.parametrize("addr", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost",
                                  "LOCALHOST", "app.localhost"])
def test_loopback_addresses_are_loopback(addr: str) -> None:
    assert access.is_loopback(addr)


@pytest.mark.parametrize("addr", ["0.0.0.0", "::", "10.0.0.5", "192.168.1.2", "example.com",
                                  "", "localhost.example.com"])
def test_other_addresses_are_not(addr: str) -> None:
    assert not access.is_loopback(addr)


def test_a_token_is_made_for_any_address_but_loopback() -> None:
    assert access.token_for("127.0.0.1", "") == ""
    made = access.token_for("0.0.0.0", "")
    assert len(made) >= 32 and made != access.token_for("0.0.0.0", "")
    # One the operator gave is required wherever it listens.
    assert access.token_for("127.0.0.1", "s3cret") == "s3cret"
    assert access.token_for("0.0.0.0", "s3cret") == "s3cret"


def test_a_request_shows_the_token_by_cookie_header_or_query() -> None:
    tok, port = "abc-123_XYZ", 8470
    cookie = access.cookie_name(port)
    assert access.authorized(tok, port, {"authorization": f"Bearer {tok}"}, {})
    assert access.authorized(tok, port, {"authorization": f"bearer  {tok} "}, {})
    assert access.authorized(tok, port, {}, {"token": tok})
    assert access.authorized(tok, port, {"cookie": f"other=1; {cookie}={tok}"}, {})
    assert not access.authorized(tok, port, {}, {})
    assert not access.authorized(tok, port, {"authorization": f"Basic {tok}"}, {})
    assert not access.authorized(tok, port, {"authorization": "Bearer abc"}, {})
    assert not access.authorized(tok, port, {}, {"token": tok + "x"})
    # Another dashboard's cookie on the same host is not this one's (rule 4).
    assert not access.authorized(tok, port, {"cookie": f"{access.cookie_name(9000)}={tok}"},
                                 {})
    assert not access.authorized(tok, port, {"cookie": '"unbalanced'}, {})
    assert access.authorized("", port, {}, {})  # no token: loopback, anyone here


@pytest.mark.parametrize("host,ok", [
    ("127.0.0.1:8470", True), ("localhost:8470", True), ("[::1]:8470", True),
    ("localhost", True), ("127.0.0.1", True),
    ("evil.example:8470", False), ("evil.example", False), ("", False),
    ("10.0.0.1:8470", False), ("[2001:db8::1]:80", False),
])
def test_without_a_token_only_this_machines_names_are_served(host: str, ok: bool) -> None:
    assert access.host_is_loopback(host) is ok
