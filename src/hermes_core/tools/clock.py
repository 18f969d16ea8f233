"""The logic behind the example time tools: the current time in a zone, and the span between dates.

Models cannot know the time, and they are bad at calendar arithmetic, so these are the classic
first tools. Results are plain dicts of strings and numbers, ready to be sent back as JSON.

The current instant comes from the module-level `_clock` (an aware UTC datetime). Tests replace
it, e.g. `monkeypatch.setattr(clock, "_clock", lambda: fixed)`, so nothing ever sleeps or
depends on the real time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime, timedelta, tzinfo
from datetime import timezone as fixed_offset_zone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

UTC = fixed_offset_zone.utc
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def _utc_now() -> datetime:
    return datetime.now(UTC)


_clock: Callable[[], datetime] = _utc_now


def now(timezone: str | None = None) -> dict[str, str]:
    """The current date and time in `timezone` (an IANA name such as "Asia/Shanghai").

    `None` or an empty name means the system's local timezone. An unknown name raises
    `ValueError` naming it, so the model can correct itself.
    """
    zone, name = _local_zone() if timezone is None or not timezone.strip() else _named_zone(timezone)
    moment = _clock().astimezone(zone)
    return {
        "iso": moment.isoformat(timespec="seconds"),
        "date": moment.strftime("%Y-%m-%d"),
        "time": moment.strftime("%H:%M:%S"),
        "weekday": WEEKDAYS[moment.weekday()],
        "timezone": name,
        "utc_offset": _format_offset(moment.utcoffset() or timedelta(0)),
    }


def date_diff(start: str, end: str) -> dict[str, int | float | str]:
    """How far `end` is from `start`; negative when `end` comes first.

    Both are ISO dates ("2024-05-01") or datetimes ("2024-05-01T13:30:00+08:00", "...Z").
    Aware values are compared as instants. A naive value is read in the other value's zone, so
    mixing "2024-05-01" with "2024-05-02T00:00:00+08:00" gives exactly one day.
    """
    first, second = _parse_iso(start, "start"), _parse_iso(end, "end")
    if (first.tzinfo is None) != (second.tzinfo is None):
        zone = first.tzinfo or second.tzinfo
        first = first.replace(tzinfo=first.tzinfo or zone)
        second = second.replace(tzinfo=second.tzinfo or zone)
    delta = second - first
    sign = -1 if delta < timedelta(0) else 1
    return {
        "days": sign * abs(delta).days,
        "seconds": delta.total_seconds(),
        "human": ("-" if sign < 0 else "") + str(abs(delta)),
    }


def weekday(text: str) -> str:
    """The English weekday of an ISO date or datetime ("2025-01-01" → "Wednesday"), as written
    (no conversion between zones)."""
    return WEEKDAYS[_parse_iso(text, "date").weekday()]


def _named_zone(name: str) -> tuple[tzinfo, str]:
    try:
        return ZoneInfo(name.strip()), name.strip()
    except (ZoneInfoNotFoundError, ValueError, OSError):  # unknown, malformed or a directory name
        raise ValueError(
            f"unknown timezone {name!r}; use an IANA name such as 'Asia/Shanghai', 'Europe/London' or 'UTC'"
        ) from None


def _local_zone() -> tuple[tzinfo, str]:
    """The system zone with its IANA name when it can be found (TZ, then /etc/localtime).

    zoneinfo has no "local zone" call, so fall back to the fixed offset the C library reports,
    named by its abbreviation (e.g. "CST"), when the name cannot be found.
    """
    configured = os.environ.get("TZ", "").removeprefix(":")
    if not configured and os.path.islink("/etc/localtime"):
        target = os.path.realpath("/etc/localtime")
        configured = target.split("zoneinfo/", 1)[1] if "zoneinfo/" in target else ""
    if configured:
        try:
            return ZoneInfo(configured), configured
        except (ZoneInfoNotFoundError, ValueError, OSError):
            pass
    local = _clock().astimezone().tzinfo or UTC
    return local, local.tzname(None) or "local"


def _parse_iso(text: str, label: str) -> datetime:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{label} must be an ISO date or datetime such as 2024-05-01, got {text!r}")
    cleaned = text.strip()
    if cleaned[-1] in "Zz":  # Python 3.10's fromisoformat does not accept the "Z" suffix
        cleaned = cleaned[:-1] + "+00:00"
    try:
        return datetime.fromisoformat(cleaned)
    except ValueError:
        raise ValueError(
            f"could not read {label} {text!r} as an ISO date or datetime "
            "(expected e.g. 2024-05-01 or 2024-05-01T13:30:00+08:00)"
        ) from None


def _format_offset(offset: timedelta) -> str:
    minutes = round(offset.total_seconds() / 60)
    sign = "-" if minutes < 0 else "+"
    hours, minutes = divmod(abs(minutes), 60)
    return f"{sign}{hours:02d}:{minutes:02d}"
