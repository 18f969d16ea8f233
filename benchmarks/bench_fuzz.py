"""10,000 hostile requests against a real gateway: responses by status, and legit ack latency.

The CI test (tests/test_fuzz_edges.py) bounded to about 1,000 requests per variant; this is the
field report's full run. Per variant (unsigned: Feishu verification token, webhook unsigned from
loopback; signed: Feishu Encrypt Key with signed requests and encrypted events, webhook HMAC), a
gateway on 127.0.0.1 serves the Feishu channel (webhook mode, with FakeFeishu) and the webhook;
the checked-in corpus (tests/data/hostile_bodies.jsonl) and hypothesis-generated bodies (JSON of
any shape and depth, lone surrogates, huge numbers, real events with one field of a wrong type,
correctly tokened and signed) are sent by two clients while legitimate events are interleaved.

Printed: the count of responses by status (the target: no 5xx at all), how many legit events were
answered exactly once, and the legit ack p99 under fuzz against the quiet baseline measured in the
same run (alternating quiet and fuzz rounds; target ≤ 2× + 20 ms). Figures are indicative: the
clients and the gateway share one event loop, on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the fuzz machinery

from _common import format_table, machine, row  # noqa: E402

from test_fuzz_edges import corpus_bodies, edge, fuzz, generated_bodies, p99, settled  # noqa: E402

TARGET_SERVER_ERRORS = 0


async def one_variant(signed: bool, requests: int, rounds: int) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        async with edge(Path(directory), signed=signed) as target:
            corpus = corpus_bodies()
            again = [
                (target, body, headers, "<500") for target, body, headers, _ in corpus
            ]  # a repeat may be a
            bodies = corpus + again * max(0, requests // 10 // len(corpus) - 1)  # duplicate or a replay (409)
            if requests > len(bodies):  # the corpus alone may already be more than a short run asks
                bodies += generated_bodies(target.feishu, requests - len(bodies), seed=int(time.time()))
            report = await fuzz(target, bodies, rounds=rounds)
            await settled(target, report)
            legit = set(report.legit_feishu) | set(report.legit_webhook)
            once = sum(1 for message_id in legit if target.answers.calls[message_id] == 1)
            stored = {message_id for _, message_id, _ in target.inbox()}
            return {
                "variant": "signed" if signed else "unsigned",
                "statuses": report.statuses,
                "hostile": report.hostile,
                "seconds": report.seconds,
                "legit": len(legit),
                "answered once": once,
                "half-stored": len(stored - legit - report.accepted),
                "failures": report.failures,
                "quiet p99": p99(report.quiet),
                "fuzz p99": p99(report.loaded),
            }


def run(requests: int = 10_000, rounds: int = 10) -> dict:
    results = [asyncio.run(one_variant(signed, requests // 2, rounds)) for signed in (False, True)]
    statuses: Counter[int] = sum((r["statuses"] for r in results), Counter())
    server_errors = sum(n for status, n in statuses.items() if status >= 500)
    rows = [
        row(
            f"{sum(r['hostile'] for r in results):,} hostile requests: responses ≥ 500",
            str(server_errors),
            "",
            server_errors,
            TARGET_SERVER_ERRORS,
            "",
        ),  # fmt: skip
    ]
    for r in results:
        limit = 2 * r["quiet p99"] + 0.020
        rows.append(row(f"legit Feishu ack p99 under fuzz vs quiet ({r['variant']})",
                        f"{r['fuzz p99'] * 1000:.1f} ms", f"{r['quiet p99'] * 1000:.1f} ms",
                        r["fuzz p99"] / r["quiet p99"], limit / r["quiet p99"]))  # fmt: skip
    return {"results": results, "statuses": statuses, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000, help="hostile requests, both variants")
    parser.add_argument("--rounds", type=int, default=10, help="alternating quiet/fuzz rounds")
    args = parser.parse_args()
    started = time.perf_counter()
    figures = run(args.requests, args.rounds)
    for r in figures["results"]:
        print(f"{r['variant']}: {r['hostile']:,} hostile requests in {r['seconds']:.1f} s; by status "
              f"{dict(sorted(r['statuses'].items()))}; {r['answered once']}/{r['legit']} legit messages "
              f"answered exactly once; {r['half-stored']} rows stored from refused requests; "
              f"{len(r['failures'])} failures")  # fmt: skip
        for failure in r["failures"][:5]:
            print("   ", failure)
    print(f"all: {dict(sorted(figures['statuses'].items()))}")
    print()
    print(format_table(figures["rows"]))
    print(f"\n{machine()}; {time.perf_counter() - started:.0f} s in all.")


if __name__ == "__main__":
    main()
