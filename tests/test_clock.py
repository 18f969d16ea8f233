"""The clock tools, with an injected instant: no sleeping, no dependence on the real time."""

from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pytest

from hermes_core.tools import clock

FIXED = datetime(2024, 5, 6, 23, 30, 15, 123456, tzinfo=timezone.utc)  # a Monday, 23:30 UTC


def _zone_available(name: str) -> bool:
    try:
        ZoneInfo(name)
    except ZoneInfoNotFoundError:
        return False
    return True


needs_tz_database = pytest.mark.skipif(
    not _zone_available("Asia/Shanghai"), reason="no IANA timezone database (install tzdata)"
)


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock, "_clock", lambda: FIXED)


@needs_tz_database
def test_now_in_a_named_zone_crosses_the_date_line() -> None:
    assert clock.now("Asia/Shanghai") == {
        "iso": "2024-05-07T07:30:15+08:00",
        "date": "2024-05-07",
        "time": "07:30:15",
        "weekday": "Tuesday",
        "timezone": "Asia/Shanghai",
        "utc_offset": "+08:00",
    }


@needs_tz_database
def test_now_handles_negative_and_fractional_offsets() -> None:
    new_york = clock.now("America/New_York")  # daylight saving time in May
    assert [new_york[key] for key in ("utc_offset", "date", "time")] == ["-04:00", "2024-05-06", "19:30:15"]
    kolkata = clock.now("Asia/Kolkata")
    assert (kolkata["utc_offset"], kolkata["time"]) == ("+05:30", "05:00:15")


@needs_tz_database
def test_now_in_utc() -> None:
    result = clock.now("UTC")
    assert result["iso"] == "2024-05-06T23:30:15+00:00"
    assert result["weekday"] == "Monday"
    assert result["utc_offset"] == "+00:00"


@needs_tz_database
def test_now_without_a_zone_uses_the_system_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    result = clock.now()
    assert result["timezone"] == "Asia/Tokyo"
    assert result["time"] == "08:30:15"
    assert clock.now("  ")["timezone"] == "Asia/Tokyo"  # an empty name means "local" too


def test_now_without_a_zone_always_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TZ", raising=False)
    result = clock.now()
    assert result["timezone"]
    assert result["utc_offset"][0] in "+-"
    assert datetime.fromisoformat(result["iso"]) == FIXED.replace(microsecond=0)


@pytest.mark.parametrize("name", ["Mars/Olympus_Mons", "Beijing", "../../etc/passwd", "/etc/localtime"])
def test_unknown_zone_raises_value_error_naming_it(name: str) -> None:
    with pytest.raises(ValueError, match="unknown timezone") as caught:
        clock.now(name)
    assert repr(name) in str(caught.value)


@pytest.mark.parametrize(
    ("start", "end", "days", "seconds", "human"),
    [
        ("2024-05-01", "2024-05-04T04:00:00", 3, 273_600.0, "3 days, 4:00:00"),
        ("2024-05-04T04:00:00", "2024-05-01", -3, -273_600.0, "-3 days, 4:00:00"),
        ("2024-01-01", "2025-01-01", 366, 31_622_400.0, "366 days, 0:00:00"),
        ("2024-05-01T10:00:00", "2024-05-01T09:00:00", 0, -3600.0, "-1:00:00"),
        ("2024-05-01", "2024-05-01", 0, 0.0, "0:00:00"),
    ],
)
def test_date_diff(start: str, end: str, days: int, seconds: float, human: str) -> None:
    assert clock.date_diff(start, end) == {"days": days, "seconds": seconds, "human": human}


def test_date_diff_compares_aware_values_as_instants() -> None:
    # 08:00 in Shanghai is midnight UTC: the same instant.
    assert clock.date_diff("2024-05-01T08:00:00+08:00", "2024-05-01T00:00:00Z")["seconds"] == 0.0
    result = clock.date_diff("2024-05-01T00:00:00-05:00", "2024-05-01T00:00:00+00:00")
    assert result["seconds"] == -5 * 3600.0


def test_date_diff_reads_a_naive_value_in_the_other_values_zone() -> None:
    result = clock.date_diff("2024-05-01", "2024-05-02T00:00:00+08:00")
    assert result == {"days": 1, "seconds": 86_400.0, "human": "1 day, 0:00:00"}


@pytest.mark.parametrize(
    ("start", "end", "label"),
    [("yesterday", "2024-05-01", "start"), ("2024-05-01", "2024-13-01", "end"), ("", "2024-05-01", "start")],
)
def test_date_diff_bad_input_names_the_argument(start: str, end: str, label: str) -> None:
    with pytest.raises(ValueError, match=label):
        clock.date_diff(start, end)


def test_date_diff_rejects_non_text() -> None:
    with pytest.raises(ValueError):
        clock.date_diff(20240501, "2024-05-01")  # type: ignore[arg-type]
