"""The LiteLLM callback and routing strategy against a real LiteLLM Router
and fake OpenAI-compatible upstreams (no Kafka, no Redis: the emitter is a
recorder and the weights are fed to the reader directly)."""

import asyncio
import json
import socket

import pytest

litellm = pytest.importorskip("litellm")
from litellm import Router  # noqa: E402

from fake_upstream import FakeUpstream  # noqa: E402
from hermes_gateway.litellm import HermesLogger, HermesRefused, HermesRouting  # noqa: E402


class Recorder:
    def __init__(self):
        self.events = []

    def emit(self, event):
        self.events.append(event)
        return True


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def world():
    ups = {n: FakeUpstream(n) for n in ("free-a", "paid-a", "paid-b")}
    router = Router(
        model_list=[
            {"model_name": "chat", "litellm_params": {"model": f"openai/m-{n}", "api_base": u.url, "api_key": "x"},
             "model_info": {"id": n}}
            for n, u in ups.items()
        ],
        num_retries=1,
        disable_cooldowns=True,
    )
    rec = Recorder()
    logger = HermesLogger(rec, "gw-test")
    litellm.callbacks = [logger]
    routing = HermesRouting(router, f"redis://127.0.0.1:{closed_port()}/", emitter=rec, gateway_id="gw-test")
    router.register_plugin(routing)
    yield ups, router, rec, routing
    litellm.callbacks = []
    routing.close()
    for u in ups.values():
        u.stop()


def snapshot(weights, shed=0.0, version=1):
    return json.dumps({
        "group": "chat", "version": version, "epoch": 1, "computed_at_ms": 1, "heartbeat_ms": 1,
        "manual": False, "projected_spend_per_hour": 0.0,
        "classes": {"CORE": {"weights": weights, "shed": shed}, "INTERACTIVE": {"weights": weights, "shed": 1.0}},
        "channels": {c: {"state": "HEALTHY", "score": 0.0, "reason": "healthy", "planned_rps": 1.0} for c in weights},
    })


async def ask(router, n=1, **kw):
    out = []
    for _ in range(n):
        try:
            out.append(await router.acompletion(model="chat", messages=[{"role": "user", "content": "hi"}], **kw))
        except Exception as e:  # noqa: BLE001
            out.append(e)
    await asyncio.sleep(0.3)  # LiteLLM logs after the call returns
    return out


def test_routing_follows_the_weights_and_each_attempt_is_one_event(world):
    ups, router, rec, routing = world
    asyncio.run(ask(router, 1))  # creates the reader (static: equal shares)
    routing.readers["chat"].offer(snapshot({"free-a": 0.0, "paid-a": 0.0, "paid-b": 1.0}))
    rec.events.clear()
    asyncio.run(ask(router, 10))
    assert ups["paid-b"].served >= 10 and ups["free-a"].served + ups["paid-a"].served <= 1
    assert [e["channel_id"] for e in rec.events[-10:]] == ["paid-b"] * 10
    e = rec.events[-1]
    assert (e["error_class"], e["http_status"], e["finish_reason"], e["truncated"]) == ("NONE", 200, "STOP", False)
    assert e["route_group"] == "chat" and e["gateway_id"] == "gw-test" and e["output_tokens"] > 0


def test_a_truncated_answer_and_a_failing_upstream_are_reported_as_hermes_defines_them(world):
    ups, router, rec, routing = world
    asyncio.run(ask(router, 1))
    routing.readers["chat"].offer(snapshot({"free-a": 1.0, "paid-a": 0.0, "paid-b": 0.0}))
    ups["free-a"].set("truncated")
    rec.events.clear()
    asyncio.run(ask(router, 1))
    e = rec.events[-1]
    assert (e["channel_id"], e["truncated"], e["finish_reason"], e["output_tokens"]) == ("free-a", True, "LENGTH", 1)
    ups["free-a"].set("down")
    rec.events.clear()
    out = asyncio.run(ask(router, 1))
    assert isinstance(out[0], Exception)
    failures = [e for e in rec.events if e["error_class"] == "SERVER_ERROR"]
    assert len(failures) == 2, rec.events  # the first attempt and its retry
    assert sorted(e["attempt"] for e in failures) == [0, 1]
    assert all(e["http_status"] == 500 and e["channel_id"] == "free-a" for e in failures)


def test_streams_report_time_to_first_token_and_json_requests_are_checked(world):
    ups, router, rec, routing = world
    asyncio.run(ask(router, 1))
    routing.readers["chat"].offer(snapshot({"paid-a": 1.0}))
    rec.events.clear()

    async def stream():
        s = await router.acompletion(model="chat", messages=[{"role": "user", "content": "hi"}], stream=True)
        async for _ in s:
            pass
        await asyncio.sleep(0.3)

    asyncio.run(stream())
    e = rec.events[-1]
    assert e["ttfb_ms"] is not None and 0 <= e["ttfb_ms"] <= e["latency_ms"], e
    rec.events.clear()
    asyncio.run(ask(router, 1, response_format={"type": "json_object"}))
    assert rec.events[-1]["schema_valid"] is False, "the fake answers prose, not JSON"


def test_a_shed_class_is_refused_and_reported_as_demand(world):
    ups, router, rec, routing = world
    asyncio.run(ask(router, 1))
    routing.readers["chat"].offer(snapshot({"paid-a": 1.0}))
    rec.events.clear()
    served = sum(u.served for u in ups.values())
    out = asyncio.run(ask(router, 1, metadata={"hermes_class": "interactive"}))
    assert any(isinstance(o, HermesRefused) or "hermes: SHED" in str(o) for o in out), out
    assert sum(u.served for u in ups.values()) == served, "nothing sent"
    shed = [e for e in rec.events if e["dispatch"] == "SHED"]
    assert shed and shed[0]["traffic_class"] == "INTERACTIVE" and shed[0]["channel_id"] == "paid-a"


def test_a_request_class_comes_from_the_request_then_the_key_then_the_team_then_a_tag():
    from hermes_gateway.litellm import request_class

    assert request_class({"hermes_class": "batch"}) == "BATCH"
    assert request_class({"user_api_key_metadata": {"hermes_class": "interactive"}}) == "INTERACTIVE"
    assert request_class({"user_api_key_team_metadata": {"hermes_class": "experimental"}}) == "EXPERIMENTAL"
    assert request_class({"tags": ["team-x", "hermes_class:batch"]}) == "BATCH"
    assert request_class({}, default="batch") == "BATCH"
    assert request_class(None) == "CORE"
    assert request_class({"hermes_class": "gold"}, {"gold": "interactive"}) == "INTERACTIVE"
    both = {"hermes_class": "core", "user_api_key_metadata": {"hermes_class": "batch"}}
    assert request_class(both) == "CORE", "the request's own word wins"


def test_the_proxy_callback_narrows_each_pick_to_hermes_choice():
    from hermes_gateway.litellm import HermesProxy

    class Sink:
        def __init__(self):
            self.events = []

        def emit(self, e):
            self.events.append(e)

    proxy = HermesProxy(bootstrap_servers=f"127.0.0.1:{closed_port()}",
                        redis_url=f"redis://127.0.0.1:{closed_port()}/", gateway_id="proxy-test")
    assert proxy._ensure()
    proxy.emitter.close(0)  # no broker here: events go to the sink
    proxy.emitter = Sink()
    deployments = [{"model_name": "chat", "model_info": {"id": c}} for c in ("free-a", "paid-a", "paid-b")]
    ids = lambda out: [d["model_info"]["id"] for d in out]  # noqa: E731

    def pick(request=None):
        return asyncio.run(proxy.async_filter_deployments("chat", deployments, None, request or {}))

    # Before Hermes' first snapshot LiteLLM routes as it would alone.
    assert pick() == deployments
    proxy.reader("chat", deployments).offer(snapshot({"free-a": 0.0, "paid-a": 1.0, "paid-b": 0.0}))
    assert all(ids(pick()) == ["paid-a"] for _ in range(20))
    # A retry avoids the deployment that failed while another has weight.
    proxy.readers["chat"].offer(snapshot({"free-a": 0.0, "paid-a": 0.5, "paid-b": 0.5}, version=2))
    retry = {"_retry_skipped_deployment_ids": ["paid-a"]}
    assert all(ids(pick(retry)) == ["paid-b"] for _ in range(20))
    # Only what LiteLLM still offers (its own cool-down may have taken one).
    offered = asyncio.run(proxy.async_filter_deployments("chat", deployments[:2], None, {}))
    assert ids(offered) == ["paid-a"]
    # A class the weights shed is refused and reported as demand.
    with pytest.raises(HermesRefused):
        pick({"metadata": {"hermes_class": "interactive"}})
    assert proxy.emitter.events[-1]["dispatch"] == "SHED"
    assert proxy.emitter.events[-1]["traffic_class"] == "INTERACTIVE"
    for r in proxy.readers.values():
        r.close()
