"""Shared by the examples' tests: an example's own `hermes.yaml`, loaded from its folder as
`hermes-kernel serve` loads it, with only where it reaches changed (the model and Feishu endpoints
through their environment variables; the data folder, the hosts the web tools may read and the
addresses in its jobs' prompts as settings), and the gateway `serve` builds from it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway_harness import look_often, serving
from hermes_core.config import Settings, build_agent, load_settings
from hermes_core.gateway.dispatcher import Gateway
from hermes_core.gateway.server import build_gateway
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def endpoints(fake: FakeOpenAIServer, feishu: FakeFeishu, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment a real run sets, pointed at the fakes: the model's address and Feishu's app
    (its secrets in os.environ, where the channel reads them)."""
    monkeypatch.setenv("FEISHU_APP_SECRET", feishu.app_secret)
    monkeypatch.setenv("FEISHU_VERIFICATION_TOKEN", feishu.verification_token)
    monkeypatch.delenv("FEISHU_ENCRYPT_KEY", raising=False)
    return {"HERMES_BASE_URL": fake.base_url, "HERMES_MODEL": "scripted", "FEISHU_APP_ID": feishu.app_id,
            "FEISHU_BASE_URL": feishu.base_url}  # fmt: skip


def example_settings(
    name: str,
    env: Mapping[str, str],
    data_dir: Path,
    *,
    allow_hosts: tuple[str, ...] = (),
    addresses: Mapping[str, str] | None = None,
    apis: Mapping[str, str] | None = None,
) -> Settings:
    """examples/<name>/hermes.yaml with `env`; its data in `data_dir`, `allow_hosts` added to the
    web tools', each public address of `addresses` in its jobs' prompts replaced by a local one and
    the declared APIs named in `apis` at the base URL given there."""
    settings = load_settings(EXAMPLES / name / "hermes.yaml", env=env, dotenv=None)
    jobs = [
        job.model_copy(update={"prompt": swapped(job.prompt, addresses or {})})
        for job in settings.schedule.jobs
    ]
    update: dict[str, Any] = {
        "gateway": settings.gateway.model_copy(update={"data_dir": str(data_dir)}),
        "web": settings.web.model_copy(update={"allow_hosts": [*settings.web.allow_hosts, *allow_hosts]}),
        "schedule": settings.schedule.model_copy(update={"jobs": jobs}),
    }
    if apis:
        declared = getattr(settings, "apis")  # noqa: B009  # the `apis:` section (tools/http_api.py)
        assert set(apis) <= {api.name for api in declared}, f"the example declares no API {set(apis)}"
        update["apis"] = [
            api.model_copy(update={"base_url": apis.get(api.name, api.base_url)}) for api in declared
        ]
    return settings.model_copy(update=update)


def swapped(text: str, addresses: Mapping[str, str]) -> str:
    for public, local in addresses.items():
        assert public in text, f"the example no longer reads {public}"
        text = text.replace(public, local)
    return text


@asynccontextmanager
async def example_gateway(
    settings: Settings, clock: Callable[[], float]
) -> AsyncIterator[tuple[Gateway, str]]:
    """The gateway `serve` builds from `settings`, its scheduler on `clock`, served on a free local
    port: the gateway and its base URL; its runner and agent closed afterwards."""
    agent = build_agent(settings)
    gateway, routes = build_gateway(settings, agent, clock=clock)
    look_often(gateway)  # the test moves the clock
    try:
        async with serving(gateway, routes) as url:
            yield gateway, url
    finally:
        await gateway.runner.aclose()  # type: ignore[attr-defined]
        await agent.aclose()
