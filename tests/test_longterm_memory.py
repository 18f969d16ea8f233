"""Long-term memory (S6): past outcomes stored per owner, found by FTS5, offered as dated examples.

The tests taking `db` run twice: on SQLite (FTS5) and on PostgreSQL (its full-text search,
postgres/longterm.py, on a private server: tests/pg_server.py; skipped where none can start)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_core.memory import LongTermMemory, Outcome
from hermes_core.postgres.database import PostgresDatabase
from hermes_core.postgres.longterm import PostgresLongTermMemory
from hermes_core.storage import SQLiteDatabase

NOV_2 = datetime(2026, 11, 2, 9, 30, tzinfo=timezone.utc)
HOSTILE = ['"', '""', "AND", "OR NOT", "NEAR(", "NEAR(a b, 3)", "*", "sales*", ":", "task_type:x", "'"]
HOSTILE += ["(((", "^sales", "a -b +c", "🙂🔥", "", "   ", "\x00", '华东 AND "上海', 'col:"x" OR']


@pytest.fixture(params=["sqlite", "postgres"])
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "sqlite":
        database: Any = SQLiteDatabase(tmp_path / "hermes.db")
    else:
        database = PostgresDatabase(request.getfixturevalue("pg_url"))
    yield database
    await database.close()


def long_term(db: Any, **options: Any) -> LongTermMemory:
    """The long-term memory of the database's kind."""
    if isinstance(db, SQLiteDatabase):
        return LongTermMemory(db, **options)
    return PostgresLongTermMemory(db, **options)


def ticking_clock(start: datetime = NOV_2) -> Callable[[], datetime]:
    """A clock that advances a minute per call, so every outcome has its own time."""
    ticks = iter(range(10**9))
    return lambda: start + timedelta(minutes=next(ticks))


async def test_record_and_relevant_round_trip(db: Any) -> None:
    memory = long_term(db, clock=lambda: NOV_2)
    recorded = await memory.record(
        "feishu:ou_a", "make_report+query_sales", {"region": "East China", "period": "weekly"}, "Sales up 12%"
    )
    assert recorded.id is not None and recorded.at == NOV_2
    found = await memory.relevant("feishu:ou_a", "weekly report for East China")
    assert found == [recorded]
    assert found[0].params == {"region": "East China", "period": "weekly"}
    assert await memory.count("feishu:ou_a") == 1 and await memory.count() == 1
    assert await memory.relevant("feishu:ou_a", "reporting?") == [recorded]  # stemmed, like "make_report"


async def test_task_type_and_params_outweigh_the_result(db: Any) -> None:
    memory = long_term(db, clock=ticking_clock())
    await memory.record("u", "query_inventory", {"sku": "HX-4471"}, "done")
    await memory.record("u", "send_email", {"to": "li"}, "HX-4471")  # newer: it would win a tie
    [best, _] = await memory.relevant("u", "HX-4471")
    assert best.task_type == "query_inventory"


async def test_naive_clock_is_refused(db: Any) -> None:
    memory = long_term(db, clock=lambda: datetime(2026, 11, 2))
    with pytest.raises(ValueError, match="timezone-aware"):
        await memory.record("u", "query_sales", {}, "x")


def realistic_outcome(rng: random.Random) -> tuple[str, dict[str, str], str]:
    """Sales queries, reports, inventory, e-mail — some in Chinese; never SKU 4471 nor 西北."""
    region = rng.choice(["East China", "North China", "South China", "Shanghai", "Beijing", "Chengdu"])
    product = rng.choice(["laptops", "phones", "tablets", "monitors", "printers", "headsets", "routers"])
    region_zh = rng.choice(["华东", "华北", "华南", "西南", "东北", "上海", "北京", "成都"])
    product_zh = rng.choice(["笔记本", "手机", "平板", "显示器", "打印机", "耳机", "路由器"])
    units, month = rng.randint(1, 999), f"2026-{rng.randint(1, 12):02d}"
    period = rng.choice(["weekly", "monthly", "quarterly"])
    number = rng.choice([rng.randrange(1000, 4471), rng.randrange(4472, 9999)])
    sku = f"{rng.choice(['HX', 'KT', 'ZB'])}-{number}"
    return rng.choice(
        [
            ("query_sales", {"region": region, "product": product}, f"{units} {product} sold in {region}"),
            ("make_report+query_sales", {"region": region, "period": period}, f"{period} report: {month}.md"),
            ("query_inventory", {"warehouse": region, "sku": sku}, f"{region} holds {units} units of {sku}"),
            ("query_sales", {"地区": region_zh, "产品": product_zh}, f"{region_zh}{product_zh}销量 {units}"),
            ("send_email", {"to": "li@example.com", "subject": product}, f"Sent the {product} summary"),
        ]
    )


async def test_the_relevant_outcome_is_first_among_a_thousand(db: Any) -> None:
    memory = long_term(db, clock=ticking_clock())
    rng = random.Random(6)
    for i in range(1_000):
        if i == 417:
            await memory.record("u", "query_inventory", {"warehouse": "Chengdu", "sku": "HX-4471"},
                                "The Chengdu warehouse holds 312 units of HX-4471")  # fmt: skip
        elif i == 802:
            await memory.record("u", "make_report+query_sales", {"地区": "西北", "报表": "季度"},
                                "西北地区季度销售报表已生成")  # fmt: skip
        else:
            await memory.record("u", *realistic_outcome(rng))
    assert await memory.count("u") == 1_000

    [best, *_] = await memory.relevant("u", "How many HX-4471 units are left in the Chengdu warehouse?")
    assert best.params == {"warehouse": "Chengdu", "sku": "HX-4471"}
    [best, *_] = await memory.relevant("u", "再做一份西北的季度报表")
    assert best.result == "西北地区季度销售报表已生成"


async def test_chinese_query_matches_chinese_outcomes(db: Any) -> None:
    memory = long_term(db, clock=ticking_clock())
    for region, product, units in [("华东", "耳机", 1200), ("华南", "耳机", 800), ("华东", "手机", 300)]:
        params = {"地区": region, "产品": product}
        await memory.record("u", "query_sales", params, f"{region}{product}销量 {units} 台")
    await memory.record("u", "query_sales", {"city": "上海"}, "Q3销售额 5.2M")

    found = await memory.relevant("u", "华东的耳机卖得怎么样？", k=3)
    assert found[0].result == "华东耳机销量 1200 台"
    assert {o.result for o in found[1:]} == {"华南耳机销量 800 台", "华东手机销量 300 台"}
    # Two-character words are the commonest in Chinese; a trigram index could not find these.
    assert [o.params for o in await memory.relevant("u", "上海")] == [{"city": "上海"}]
    assert [o.result for o in await memory.relevant("u", "销售")] == ["Q3销售额 5.2M"]


async def test_hostile_query_text_never_raises(db: Any) -> None:
    memory = long_term(db)
    for owner in ["u", 'feishu:"ou" AND *', ""]:
        await memory.record(owner, "query_sales", {"region": "华东", "note": 'AND "NEAR(x" *:'}, "sales: OR")
    for text in HOSTILE:
        assert all(o.owner == "u" for o in await memory.relevant("u", text))
    assert len(await memory.relevant("u", 'NEAR( "sales" AND')) == 1
    assert len(await memory.relevant('feishu:"ou" AND *', "sales")) == 1


def test_any_text_is_a_safe_query(tmp_path: Path) -> None:
    database = SQLiteDatabase(tmp_path / "fuzz.db")
    memory = LongTermMemory(database)
    asyncio.run(memory.record("u", "query_sales", {"region": "East China"}, "ok"))

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.text(max_size=40) | st.sampled_from(HOSTILE))
    def query(text: str) -> None:
        assert isinstance(asyncio.run(memory.relevant("u", text)), list)

    try:
        query()
    finally:
        asyncio.run(database.close())


async def test_owners_never_see_each_others_outcomes(db: Any) -> None:
    memory = long_term(db, clock=ticking_clock())
    question = "monthly sales report for East China laptops"
    await memory.record("feishu:ou_a", "make_report+query_sales",
                        {"region": "East China", "product": "laptops", "period": "monthly"},
                        "monthly sales report East China laptops")  # fmt: skip
    await memory.record("feishu:ou_b", "query_weather", {"city": "Beijing"}, "sunny, a good month for sales")

    assert [o.owner for o in await memory.relevant("feishu:ou_b", question, k=10)] == ["feishu:ou_b"]
    assert [o.owner for o in await memory.relevant("feishu:ou_b", "", k=10)] == ["feishu:ou_b"]
    assert await memory.relevant("feishu:ou_c", question) == []
    assert await memory.forget("feishu:ou_a") == 1
    assert await memory.count("feishu:ou_a") == 0 and await memory.count("feishu:ou_b") == 1


async def test_a_query_without_terms_returns_the_most_recent(db: Any) -> None:
    memory = long_term(db, clock=ticking_clock())
    for n in range(5):
        await memory.record("u", "query_sales", {"n": n}, f"result {n}")
    assert [o.params["n"] for o in await memory.relevant("u", "👍 ?", k=2)] == [4, 3]
    assert await memory.relevant("u", "weather forecast") == []


async def test_examples_are_dated_short_and_in_the_requested_language(db: Any) -> None:
    memory = long_term(db)
    morning_in_beijing = datetime(2026, 11, 2, 7, 30, tzinfo=timezone(timedelta(hours=8)))  # UTC: Nov 1
    outcome = Outcome("u", "query_sales", {"region": "East China"}, "1.2M\n" + "x" * 900, morning_in_beijing)

    english = memory.format_examples([outcome])
    assert "outdated" in english
    assert 'On 2026-11-02 you did query_sales with {"region": "East China"} → result: 1.2M x' in english
    assert len(english.splitlines()[1]) < 320 and english.endswith("…")

    chinese = memory.format_examples([outcome], language="zh")
    assert "过时" in chinese and "outdated" not in chinese
    assert '2026-11-02 你执行过 query_sales，参数 {"region": "East China"}，结果：1.2M x' in chinese
    assert memory.format_examples([], language="zh") == ""


async def test_max_per_owner_keeps_the_newest(db: Any) -> None:
    memory = long_term(db, clock=ticking_clock(), max_per_owner=5)
    for n in range(8):
        await memory.record("a", "query_sales", {"n": n}, f"alpha result {n}")
    for n in range(3):
        await memory.record("b", "query_sales", {"n": n}, f"beta result {n}")

    assert await memory.count("a") == 5 and await memory.count("b") == 3
    kept = await memory.relevant("a", "alpha result", k=10)
    assert sorted(o.params["n"] for o in kept) == [3, 4, 5, 6, 7]
    if isinstance(db, SQLiteDatabase):
        indexed = await db.transaction(
            lambda conn: conn.execute("SELECT count(*) FROM longterm_fts").fetchone()
        )
        assert indexed == (8,)  # the search index shrinks with the table


async def test_memory_survives_reopening_the_file(tmp_path: Path) -> None:
    first = SQLiteDatabase(tmp_path / "hermes.db")
    recorded = await LongTermMemory(first, clock=lambda: NOV_2).record(
        "u", "query_sales", {"region": "华东"}, "华东销售额 1.2M"
    )
    await first.close()

    again = SQLiteDatabase(tmp_path / "hermes.db")
    try:
        assert await LongTermMemory(again).relevant("u", "华东销售额") == [recorded]
    finally:
        await again.close()


async def test_prune_deletes_the_outcomes_recorded_before_the_cut_whatever_their_offset(db: Any) -> None:
    """`memory.retention_days` (item 18 of the second round of attacks: nothing was ever deleted by
    age). Outcomes are stored with their own UTC offset: 09:00 in Shanghai is 01:00 UTC, before a
    cut at 01:30 UTC, though its text sorts after it."""
    cut = datetime(2026, 11, 2, 1, 30, tzinfo=timezone.utc)
    shanghai = timezone(timedelta(hours=8))
    for at, note in [(datetime(2026, 11, 2, 9, 0, tzinfo=shanghai), "old"),
                     (datetime(2026, 11, 2, 1, 45, tzinfo=timezone.utc), "new")]:  # fmt: skip
        await long_term(db, clock=lambda at=at: at).record("feishu:ou_a", "lookup", {"q": note}, note)
    memory = long_term(db)
    assert await memory.prune(cut.timestamp()) == 1
    assert [o.result for o in await memory.relevant("feishu:ou_a", "lookup")] == ["new"]
