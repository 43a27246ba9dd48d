"""Periodic jobs in memory: the calendar (`gavel.shared.cron`: fire times in a zone, across
a DST change), the decisions (`gavel.shared.periodic`: what is due given now, the position,
overlap and catch-up), and the spec's refusals naming the field."""

from __future__ import annotations

import msgspec
import pytest

from gavel.shared import cron
from gavel.shared.periodic import MISSED_MAX, Due, decide, next_fire, run_id
from gavel.shared.reasons import Reason
from gavel.shared.spec import Spec

#: 2026-12-02T06:00:00Z, a Wednesday.
T = 1_796_191_200
assert cron.stamp(T) == "2026-12-02T06:00:00Z"


def test_fire_times_after_and_at_or_before() -> None:
    assert cron.fires_after("*/10 * * * * *", None, T) == T + 10
    assert cron.fires_after("*/10 * * * * *", None, T + 3) == T + 10
    assert cron.latest_at_or_before("*/10 * * * * *", None, T) == T  # at counts
    assert cron.latest_at_or_before("*/10 * * * * *", None, T + 9) == T
    assert cron.fires_after("@hourly", "UTC", T) == T + 3600
    assert cron.fires_after("0 2 * * *", None, T) == T + 20 * 3600  # 02:00 tomorrow


def test_a_time_zone_moves_the_fire_time_and_dst_is_crossed_as_cron_does() -> None:
    # 08:00 in Riga is 06:00Z in winter (EET, +2) ...
    assert cron.fires_after("0 8 * * *", "Europe/Riga", T - 1) == T
    # ... and 05:00Z in summer (EEST, +3): 2026-07-01T08:00+03:00.
    assert cron.stamp(cron.fires_after("0 8 1 7 *", "Europe/Riga", T) or 0) \
        == "2027-07-01T05:00:00Z"
    # 03:30 on the night Riga springs forward (03:00 -> 04:00, 2026-03-29) does not exist:
    # it runs once, at the jump, as Debian cron does.
    before = 1_774_731_600  # 2026-03-28T21:00:00Z
    got = cron.fires_after("30 3 * * *", "Europe/Riga", before)
    assert got is not None and cron.local(got, "Europe/Riga").startswith("2026-03-29 04:")
    assert cron.fires_after("30 3 * * *", "Europe/Riga", got) == got + 24 * 3600 - 1800


def test_nothing_is_due_before_the_first_fire_time_after_the_position() -> None:
    assert decide("*/10 * * * * *", None, None, T, T + 9, live=False) is None
    assert decide("*/10 * * * * *", None, None, T, T + 10, live=False) == Due(at=T + 10)


def test_a_due_run_is_made_once_the_position_moves_past_it() -> None:
    assert decide("* * * * * *", None, None, T + 5, T + 5, live=False) is None


def test_missed_fire_times_run_once_the_latest_and_are_counted() -> None:
    got = decide("*/10 * * * * *", None, None, T, T + 65, live=False)
    assert got == Due(at=T + 60, missed=5)  # 10 .. 50 collapsed into 60


def test_the_missed_count_is_bounded() -> None:
    got = decide("* * * * * *", None, None, T, T + 10 * MISSED_MAX, live=False)
    assert got is not None and got.at == T + 10 * MISSED_MAX and got.missed == MISSED_MAX


def test_overlap_skip_skips_while_a_run_is_live_and_allow_runs() -> None:
    for overlap in (None, "skip"):
        assert decide("* * * * * *", None, overlap, T, T + 1, live=True) == \
            Due(at=T + 1, skipped=Reason.PERIODIC_OVERLAP)
    assert decide("* * * * * *", None, "allow", T, T + 1, live=True) == Due(at=T + 1)
    assert decide("* * * * * *", None, "skip", T, T + 1, live=False) == Due(at=T + 1)


def test_a_stopped_job_makes_nothing() -> None:
    assert decide("* * * * * *", None, None, T, T + 5, live=False, stopped=True) is None


def test_next_fire_is_after_the_position_and_now() -> None:
    assert next_fire("*/10 * * * * *", None, T, T + 3) == T + 10
    assert next_fire("*/10 * * * * *", None, T + 20, T + 3) == T + 30


def test_a_run_id_is_its_job_and_fire_time() -> None:
    assert run_id("nightly", T) == "nightly-20261202t060000z"


def test_stamps_round_trip() -> None:
    assert cron.unstamp(cron.stamp(T)) == T
    assert cron.unstamp("") is None and cron.unstamp("2026-02-30T00:00:00Z") is None


@pytest.mark.parametrize(("fields", "words"), [
    ({"schedule": "* * *"}, "schedule '* * *' is not a cron expression (wrong number of "
                            "fields)"),
    ({"schedule": "61 * * * *"}, "schedule '61 * * * *' is not a cron expression (bad "
                                 "minute)"),
    ({"schedule": "0 0 30 2 *"}, "is not a cron expression (bad day-of-month)"),
    ({"schedule": "@daily", "time_zone": "Mars/Olympus"},
     "time_zone 'Mars/Olympus' is not a time zone zoneinfo knows"),
    ({"schedule": "@daily", "time_zone": "../../etc/passwd"}, "time_zone '../../etc/passwd' "
                                                               "is not a time zone"),
    ({"schedule": "@daily", "overlap": "queue"}, "overlap 'queue' is not one of: skip, allow"),
    ({"schedule": "@daily", "type": "service"}, "schedule applies to a job (type = \"job\"), "
                                                "not to a service"),
    ({"schedule": "@daily", "type": "system"}, "not to a system job"),
    ({"schedule": "@daily", "count": 3}, "count does not apply to a periodic job"),
    ({"schedule": "@daily", "parallelism": 2}, "parallelism does not apply to a periodic job:"
                                                " each run is one instance, not a batch array"),
    ({"schedule": "@daily", "max_failures": 1}, "max_failures does not apply to a periodic "
                                                "job"),
    ({"time_zone": "UTC"}, "time_zone applies to a periodic job: give the job a schedule"),
    ({"overlap": "allow"}, "overlap applies to a periodic job"),
])
def test_bad_periodic_fields_are_refused_naming_the_field(fields: dict[str, object],
                                                          words: str) -> None:
    raw = {"name": "n", "command": ["true"], **fields}
    with pytest.raises(msgspec.ValidationError, match=None) as got:
        msgspec.convert(raw, Spec)
    assert words in str(got.value)


def test_good_periodic_specs_decode() -> None:
    for fields in ({"schedule": "*/5 * * * *", "time_zone": "Europe/Riga", "overlap": "allow"},
                   {"schedule": "* * * * * *"}, {"schedule": "@weekly", "time_zone": "UTC"}):
        spec = msgspec.convert({"name": "n", "command": ["true"], **fields}, Spec)
        assert spec.schedule == fields["schedule"]
