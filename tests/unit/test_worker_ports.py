"""`worker.ports.assign` with a probe standing in for the bind check: the broker's ports
where usable, replacements from the top, and - the range too full - `short`, still naming
the awarded ports found taken so the broker can block them."""

from __future__ import annotations

from gavel.worker.ports import assign


def test_awarded_ports_are_kept_when_they_bind() -> None:
    got = assign(["http"], {"http": 10}, [10, 20], held=[], reserved=[], free=lambda p: True)
    assert got.ports == {"http": 10} and not got.taken and not got.short


def test_a_taken_port_is_replaced_from_the_top_and_reported() -> None:
    got = assign(["http", "admin"], {"http": 10, "admin": 11}, [10, 20], held=[],
                 reserved=[20], free=lambda p: p != 11)
    assert got.ports == {"http": 10, "admin": 19} and got.taken == [11] and not got.short


def test_a_full_range_is_short_and_still_names_the_taken_ports() -> None:
    """Three ports, one taken outside gavel, one held by a local instance: the award's two
    cannot both be had. The instance is handed back, and the taken port goes with the report
    (else the next award carries it again); the held one is gavel's, never reported."""
    got = assign(["http", "admin"], {"http": 10, "admin": 11}, [10, 12], held=[12],
                 reserved=[], free=lambda p: p != 11)
    assert got.short and got.taken == [11]
    held_clash = assign(["http"], {"http": 12}, [10, 12], held=[12], reserved=[10, 11],
                        free=lambda p: True)
    assert held_clash.short and held_clash.taken == []
