"""A long connection that is down, or has given up, shows where an operator looks: /healthz lists
it under `degraded` and GET /metrics has `hermes_feishu_longconn_up 0`. Before, a connection that
gave up left /healthz healthy while no event arrived any more.

The fake platform plays the outage (testing/fake_feishu/ws.py): it drops every long connection
(`disconnect_all`) and refuses new ones (more than `max_ws_connections` clients: code 1000040350),
with the platform's `ClientConfig` (ReconnectCount, ReconnectInterval) from the handshake (FEISHU.md
§8, lark-oapi ws/client.py `_reconnect`). /healthz is `Gateway.degraded` (what `serve`'s
handler returns), /metrics the process registry's exposition, parsed with
prometheus_client's parser.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gateway_harness import feishu_gateway
from hermes_core.gateway.dispatcher import Gateway
from hermes_core.observe.metrics import REGISTRY
from hermes_core.testing.fake_feishu import FakeFeishu
from waiting import eventually


def link_up(app_id: str) -> float | None:
    """`hermes_feishu_longconn_up{app_id=…}` as GET /metrics renders it."""
    for family in text_string_to_metric_families(REGISTRY.render()):
        for sample in family.samples:
            if sample.name == "hermes_feishu_longconn_up" and sample.labels == {"app_id": app_id}:
                return sample.value
    return None


def longconn_parts(gateway: Gateway) -> list[dict]:
    return [part for part in gateway.degraded() if part["component"] == "feishu.longconn"]


async def test_a_long_connection_that_gives_up_is_degraded_on_healthz_and_0_on_metrics(
    tmp_path: Path,
) -> None:
    async with FakeFeishu(app_id="cli_gives_up", time_scale=0.001) as feishu:
        feishu.ws_client_config.update(ReconnectCount=2, ReconnectInterval=0.3, ReconnectNonce=0)
        async with feishu_gateway(tmp_path, feishu, mode="longconn") as (gateway, _):
            await eventually(lambda: feishu.ws_clients == 1 and link_up(feishu.app_id) == 1)
            assert longconn_parts(gateway) == []
            feishu.max_ws_connections = 0  # every reconnect is refused from now on
            await feishu.disconnect_all()
            await eventually(lambda: bool(longconn_parts(gateway)))
            assert link_up(feishu.app_id) == 0
            assert "reconnecting" in longconn_parts(gateway)[0]["detail"]
            await eventually(lambda: "gave up" in str(longconn_parts(gateway)))
            [part] = longconn_parts(gateway)
            assert link_up(feishu.app_id) == 0 and feishu.ws_clients == 0
    assert "no event arrives until serve is restarted" in part["detail"] and part["attempts"] == 2


async def test_a_dropped_long_connection_is_degraded_until_it_is_back(tmp_path: Path) -> None:
    async with FakeFeishu(app_id="cli_comes_back", time_scale=0.001) as feishu:
        feishu.ws_client_config.update(ReconnectInterval=0.3, ReconnectNonce=0)
        async with feishu_gateway(tmp_path, feishu, mode="longconn") as (gateway, _):
            await eventually(lambda: feishu.ws_clients == 1 and link_up(feishu.app_id) == 1)
            feishu.max_ws_connections = 0
            await feishu.disconnect_all()
            await eventually(lambda: bool(longconn_parts(gateway)) and link_up(feishu.app_id) == 0)
            feishu.max_ws_connections = 50  # the platform takes clients again
            await eventually(lambda: feishu.ws_clients == 1 and link_up(feishu.app_id) == 1)
            assert longconn_parts(gateway) == []
            envelope = feishu.user_message("still there?", chat_id="oc_back")
            await feishu.ws_deliver(envelope)
            await eventually(lambda: len(feishu.messages_in("oc_back")) == 1)
