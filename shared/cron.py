"""A periodic job's schedule: its fields as the operator writes them, and when its cron
expression fires, in a time zone.

Rules:
1. An expression is cron's five fields (minute hour day-of-month month day-of-week), or six
   with seconds first, or one of the macros ``@yearly`` (``@annually``), ``@monthly``,
   ``@weekly``, ``@daily`` (``@midnight``) and ``@hourly``. cronsim evaluates it, as Debian
   cron would, DST changes included (a time that a spring-forward skips runs once, an hour
   that autumn repeats runs once); the time zone is an IANA name (zoneinfo), UTC by default.
2. Times are whole POSIX seconds (UTC): the core keeps no clock types. This module reads no
   clock: every answer is about the `now` it is given.
3. An expression that never fires within cronsim's horizon (50 years) is refused like a
   malformed one: a schedule that never runs is a mistake, not a job.
4. The fields are a job's only (a service or system job runs all the time), one instance a
   run (no `count`), and `time_zone` and `overlap` mean nothing without a `schedule`.
"""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

__all__ = ["MACROS", "OVERLAP", "fields_problem", "fires_after", "latest_at_or_before",
           "local", "problem", "stamp", "unstamp", "zone", "zoned"]

#: The macros rule 1 accepts, as the five fields they stand for.
MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
          "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
          "@hourly": "0 * * * *"}


#: What a periodic job's `overlap` may say; the first is the default
#: (`gavel.shared.periodic` rule 4).
OVERLAP = ("skip", "allow")
#: Any time a schedule is tried from, to find it never fires (rule 3).
_TRY_FROM = 1_767_225_600  # 2026-01-01T00:00:00Z


def fields_problem(kind: str, count: int, schedule: str | None, time_zone: str | None,
                   overlap: str | None) -> str:
    """Why a spec's periodic fields are not usable (rule 4), as one sentence naming the
    field; "" when they are (or it has none)."""
    if schedule is None:
        for field, value in (("time_zone", time_zone), ("overlap", overlap)):
            if value is not None:
                return f"{field} applies to a periodic job: give the job a schedule " \
                       "(schedule = \"0 2 * * *\")"
        return ""
    if kind != "job":
        what = "system job" if kind == "system" else kind
        return f"schedule applies to a job (type = \"job\"), not to a {what}: a service or " \
               "a system job runs all the time"
    if count != 1:
        return "count does not apply to a periodic job: each run is one instance"
    if overlap is not None and overlap not in OVERLAP:
        return f"overlap {overlap!r} is not one of: {', '.join(OVERLAP)}"
    return problem(schedule, time_zone, _TRY_FROM)


def zone(name: str | None) -> tzinfo:
    """The time zone `name` names (None or "": UTC); KeyError for a name zoneinfo lacks."""
    if not name or name == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise KeyError(name) from exc


def _fields(expr: str) -> str:
    return MACROS.get(expr.strip().lower(), expr)


def problem(expr: str, time_zone: str | None, at: int) -> str:
    """Why `expr` in `time_zone` is not a usable schedule ("" if it is), as the rest of a
    sentence about the field at fault; `at`: any time to try it from (rule 3)."""
    try:
        tz = zone(time_zone)
    except KeyError:
        return f"time_zone {time_zone!r} is not a time zone zoneinfo knows (an IANA name " \
               "such as \"Europe/Riga\", or \"UTC\")"
    try:
        it = CronSim(_fields(expr), datetime.fromtimestamp(at, tz))
    except (CronSimError, ValueError, IndexError) as exc:
        why = str(exc)[:1].lower() + str(exc)[1:]
        return f"schedule {expr!r} is not a cron expression ({why}): five fields " \
               "(minute hour day-of-month month day-of-week), six with seconds first, or " \
               "@hourly, @daily, @weekly, @monthly, @yearly"
    try:
        next(it)
    except StopIteration:
        return f"schedule {expr!r} never fires (not in the next 50 years)"
    return ""


def fires_after(expr: str, time_zone: str | None, after: int) -> int | None:
    """The first time the schedule fires strictly after `after`; None for none (rule 3)."""
    it = CronSim(_fields(expr), datetime.fromtimestamp(after, zone(time_zone)))
    try:
        return int(next(it).timestamp())
    except StopIteration:
        return None


def latest_at_or_before(expr: str, time_zone: str | None, now: int) -> int | None:
    """The last time the schedule fired at or before `now`; None for none in 50 years."""
    it = CronSim(_fields(expr), datetime.fromtimestamp(now + 1, zone(time_zone)),
                 reverse=True)
    try:
        return int(next(it).timestamp())
    except StopIteration:
        return None


def stamp(at: int) -> str:
    """`at` as a record's stamp: RFC 3339 in UTC (`gavel.shared.records.STAMP_PATTERN`)."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def unstamp(text: str) -> int | None:
    """The POSIX second a record's stamp names; None for "" or one naming no real time."""
    if not text:
        return None
    try:
        return int(datetime.fromisoformat(text).timestamp())
    except ValueError:
        return None


def local(at: int, time_zone: str | None) -> str:
    """`at` as the schedule's zone reads it (``2026-12-02 07:00:00 EET``), for operators."""
    return datetime.fromtimestamp(at, zone(time_zone)).strftime("%Y-%m-%d %H:%M:%S %Z")


def zoned(stamp: str, time_zone: str | None) -> str:
    """A record's stamp as the schedule's zone reads it (``2026-12-02 02:00:00 EET``), "-"
    for none; one naming no time, or in a zone this machine's tz database lacks, as it is."""
    at = unstamp(stamp)
    if at is None:
        return stamp or "-"
    try:
        return local(at, time_zone)
    except KeyError:
        return stamp
