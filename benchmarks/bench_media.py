"""Downloads of pictures and files: how long one takes, and how early an oversize one stops.

    python benchmarks/bench_media.py [--runs 5]

Over real HTTP against the fake Feishu platform (its message resource API, in this process):
- a 10 MB picture within the 10 MB limit, fetched whole (`download_resource`), median of `runs`;
- a 48 MB picture sent without Content-Length against a 1 MB limit: the time to the refusal, and
  how many bytes the platform managed to write before the client hung up (the socket buffers
  absorb some; the rest is never sent);
- the same with Content-Length: refused from the headers.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import format_table  # noqa: E402

MB = 1024 * 1024
PNG = b"\x89PNG\r\n\x1a\n"


async def measure(runs: int) -> list[dict[str, str]]:
    from hermes_core.channels.feishu.api import FeishuAPI
    from hermes_core.channels.feishu.resources import download_resource
    from hermes_core.channels.media import MediaRefused
    from hermes_core.testing.fake_feishu import FakeFeishu

    rows: list[dict[str, str]] = []
    async with FakeFeishu() as feishu:
        api = FeishuAPI(feishu.app_id, feishu.app_secret, base_url=feishu.base_url)

        async def fetch(data: bytes, limit: int, chunked: bool) -> tuple[float, str]:
            feishu.add_resource("om_bench", "img_bench", data, chunked=chunked)
            feishu.resource_reads.clear()
            started = time.perf_counter()
            try:
                fetched = await download_resource(
                    api, "om_bench", "img_bench", "image", limit=limit, timeout=30
                )
                outcome = f"{len(fetched.data) / MB:.0f} MB fetched"
            except MediaRefused as refused:
                outcome = f"refused ({refused.reason})"
            elapsed = time.perf_counter() - started
            for _ in range(200):  # the fake notices the hang-up on its next write
                if feishu.resource_reads and (
                    feishu.resource_reads[0].cut_off or feishu.resource_reads[0].complete
                ):
                    break
                await asyncio.sleep(0.01)
            served = feishu.resource_reads[0].served if feishu.resource_reads else 0
            return elapsed, f"{outcome}; {served / MB:.1f} of {len(data) / MB:.0f} MB sent"

        cases = [
            ("10 MB picture, limit 10 MB", PNG + bytes(10 * MB - len(PNG)), 10 * MB, False),
            ("48 MB, no Content-Length, limit 1 MB", PNG + bytes(48 * MB), MB, True),
            ("48 MB, Content-Length, limit 1 MB", PNG + bytes(48 * MB), MB, False),
        ]
        for name, data, limit, chunked in cases:
            times, outcome = [], ""
            for _ in range(runs):
                elapsed, outcome = await fetch(data, limit, chunked)
                times.append(elapsed)
            rows.append(
                {"case": name, "median": f"{statistics.median(times) * 1000:.0f} ms", "outcome": outcome}
            )
        await api.aclose()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    rows = asyncio.run(measure(args.runs))
    print(format_table(rows, ("case", "median", "outcome")))


if __name__ == "__main__":
    main()
