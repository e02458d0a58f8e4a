"""LiteLLM on Hermes: a ``CustomLogger`` that turns every attempt LiteLLM
makes into one request event, a routing strategy that makes LiteLLM's
``Router`` pick deployments by Hermes' weights, and :data:`proxy_handler`,
both in one callback the LiteLLM *Proxy* loads from its ``config.yaml``
(``litellm_settings.callbacks``), configured by environment variables.

Mapping (docs/integration.md#the-litellm-proxy):

- A LiteLLM **model group** (``model_name`` in the model list) is a Hermes
  **route group** (``route_groups`` renames them); a **deployment** is a
  **channel**, identified by ``model_info.hermes_channel`` or else
  ``model_info.id`` (set it: LiteLLM otherwise makes up a hash).
- The request's class is ``metadata["hermes_class"]`` (``interactive``,
  ``core``, ``batch``, ``experimental``, or a label mapped by
  ``class_mapping``), else the calling key's or team's metadata
  ``hermes_class`` (the Proxy's ``user_api_key_metadata`` and
  ``user_api_key_team_metadata``), else a request tag ``hermes_class:<class>``;
  CORE when absent (see :func:`request_class`).
- Bad answers, as Hermes defines them: finish reason ``length`` is a
  truncated answer (``truncated`` = true, ``finish_reason`` = LENGTH); an
  answer with no content and no tool call reports ``output_tokens`` = 0 (an
  empty answer); when the request asked for JSON (``response_format``) the
  content is parsed, and checked against the JSON schema when one was given
  (``schema_valid``).
- Every attempt is one event: LiteLLM calls the logger once per attempt,
  retries and fallbacks included (``attempt`` counts the retries). A
  streamed answer is one event at its end, with the time to first token.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import threading
from datetime import datetime
from typing import Any, Mapping

import jsonschema
from litellm.integrations.custom_logger import CustomLogger
from litellm.types.router import CustomRoutingStrategyBase

from .emitter import EventEmitter
from .event import attempt, error_class_for_status
from .reader import WeightReader
from .snapshot import normalize_class

log = logging.getLogger("hermes_gateway")

CLASS_KEY = "hermes_class"

_FINISH = {
    "stop": "STOP",
    "length": "LENGTH",
    "content_filter": "CONTENT_FILTER",
    "tool_calls": "TOOL_CALLS",
    "function_call": "TOOL_CALLS",
    "error": "ERROR",
}


class HermesRefused(Exception):
    """Hermes' weights say not to send this request: ``outcome`` is SHED
    (the class's shed share: queue, degrade or drop it) or NO_CHANNEL (no
    deployment of the group has weight for its class). Both were reported
    to Hermes as demand."""

    status_code = 429

    def __init__(self, outcome: str, group: str, cls: str):
        super().__init__(f"hermes: {outcome} for class {cls} of model group {group}")
        self.outcome, self.group, self.cls = outcome, group, cls


def deployment_channel(deployment: Mapping[str, Any]) -> str:
    info = deployment.get("model_info") or {}
    return str(info.get("hermes_channel") or info.get("id"))


def _ms(t: Any) -> float | None:
    if isinstance(t, datetime):
        return t.timestamp() * 1000.0
    if isinstance(t, (int, float)):
        return float(t) * 1000.0
    return None


def _metadata(kwargs: Mapping[str, Any]) -> dict:
    params = kwargs.get("litellm_params") or {}
    return dict(
        params.get("metadata") or kwargs.get("metadata") or params.get("litellm_metadata")
        or kwargs.get("litellm_metadata") or {}
    )


TAG_PREFIX = CLASS_KEY + ":"


def request_class(metadata: Mapping[str, Any] | None, class_mapping: Mapping[str, str] | None = None,
                  default: str | None = None) -> str:
    """The Hermes class of a request, from what LiteLLM knows of it, first
    found wins: the request's own ``metadata["hermes_class"]``; the calling
    virtual key's metadata, then its team's (the Proxy copies them into
    ``user_api_key_metadata`` and ``user_api_key_team_metadata``); a tag
    ``hermes_class:<class>`` (request or key tags); else ``default``
    (CORE when unset). Labels go through ``class_mapping``."""
    m = metadata or {}
    for source in (m, m.get("user_api_key_metadata"), m.get("user_api_key_team_metadata")):
        if isinstance(source, Mapping) and source.get(CLASS_KEY):
            return normalize_class(str(source[CLASS_KEY]), class_mapping)
    for tag in m.get("tags") or ():
        if isinstance(tag, str) and tag.startswith(TAG_PREFIX):
            return normalize_class(tag[len(TAG_PREFIX):], class_mapping)
    return normalize_class(default, class_mapping)


def _content(response_obj: Any) -> tuple[str | None, str | None, bool]:
    """(content, finish_reason, has_tool_calls) of the first choice."""
    try:
        choice = response_obj.choices[0]
    except (AttributeError, IndexError, TypeError):
        return None, None, False
    message = getattr(choice, "message", None)
    content = getattr(message, "content", None) if message is not None else None
    tools = bool(getattr(message, "tool_calls", None) or getattr(message, "function_call", None))
    return content, getattr(choice, "finish_reason", None), tools


def judge_json(content: str | None, response_format: Any) -> bool | None:
    """``schema_valid`` for a request that asked for JSON; None otherwise."""
    if not isinstance(response_format, Mapping):
        return None
    kind = response_format.get("type")
    if kind not in ("json_object", "json_schema"):
        return None
    try:
        value = json.loads(content or "")
    except ValueError:
        return False
    schema = (response_format.get("json_schema") or {}).get("schema") if kind == "json_schema" else None
    if schema:
        try:
            jsonschema.validate(value, schema)
        except jsonschema.ValidationError:
            return False
    return True


def _error_class(exc: BaseException | None) -> tuple[str, int]:
    """(error_class, http_status) of a failed attempt."""
    if exc is None:
        return "OTHER", 0
    name = type(exc).__name__
    status = getattr(exc, "status_code", None)
    if "Timeout" in name:
        return "READ_TIMEOUT", 0
    if "Cancel" in name:
        return "CANCELLED", 0
    if isinstance(status, int) and status >= 400:
        return error_class_for_status(status), status
    if "Connection" in name:
        return "CONNECT_ERROR", 0
    return "OTHER", 0


class HermesLogger(CustomLogger):
    """Emits one request event per LiteLLM attempt."""

    def __init__(
        self,
        emitter: EventEmitter,
        gateway_id: str,
        *,
        route_groups: Mapping[str, str] | None = None,
        class_mapping: Mapping[str, str] | None = None,
    ):
        super().__init__()
        self.emitter = emitter
        self.gateway_id = gateway_id
        self.route_groups = dict(route_groups or {})
        self.class_mapping = dict(class_mapping or {})
        self.default_class: str | None = None
        self.events = 0

    # LiteLLM calls the sync hooks for sync calls and the async ones for
    # async calls; both build the same event.
    def log_success_event(self, kwargs, response_obj, start_time, end_time):
        self._emit(kwargs, response_obj, start_time, end_time, failed=False)

    def log_failure_event(self, kwargs, response_obj, start_time, end_time):
        self._emit(kwargs, response_obj, start_time, end_time, failed=True)

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        self._emit(kwargs, response_obj, start_time, end_time, failed=False)

    async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):
        self._emit(kwargs, response_obj, start_time, end_time, failed=True)

    def event_for(self, kwargs, response_obj, start_time, end_time, *, failed: bool) -> dict | None:
        """The request event of one attempt, or None when it cannot be tied
        to a deployment (a call outside a Router)."""
        slo = kwargs.get("standard_logging_object") or {}
        metadata = _metadata(kwargs)
        info = metadata.get("model_info") or (kwargs.get("litellm_params") or {}).get("model_info") or {}
        channel = info.get("hermes_channel") or slo.get("model_id") or info.get("id")
        group = slo.get("model_group") or metadata.get("model_group")
        if not channel or not group:
            return None
        start, end = _ms(start_time), _ms(end_time)
        latency = (end - start) if start is not None and end is not None else 0.0
        fields: dict[str, Any] = {
            "traffic_class": request_class(metadata, self.class_mapping, self.default_class),
            "attempt": int(metadata.get("request_retry_count") or metadata.get("attempted_retries") or 0),
            "input_tokens": int(slo.get("prompt_tokens") or 0),
            "cost": float(slo.get("response_cost") or 0.0),
            "trace_id": slo.get("trace_id") or kwargs.get("litellm_trace_id"),
        }
        first_token = _ms(kwargs.get("completion_start_time"))
        if kwargs.get("stream") and first_token is not None and start is not None and first_token < (end or 0):
            fields["ttfb_ms"] = int(first_token - start)
        if failed:
            error_class, status = _error_class(kwargs.get("exception"))
            fields.update(http_status=status)
        else:
            error_class = "NONE"
            content, finish, tools = _content(response_obj)
            fields["http_status"] = 200
            fields["finish_reason"] = _FINISH.get(finish or "", "UNKNOWN")
            fields["truncated"] = finish == "length"
            usage = getattr(response_obj, "usage", None)
            if not content and not tools:
                fields["output_tokens"] = 0
            elif usage is not None and getattr(usage, "completion_tokens", None) is not None:
                fields["output_tokens"] = int(usage.completion_tokens)
            params = kwargs.get("optional_params") or {}
            fields["schema_valid"] = judge_json(content, params.get("response_format") or kwargs.get("response_format"))
            if "ttfb_ms" not in fields and not kwargs.get("stream"):
                fields["ttfb_ms"] = int(latency)
        return attempt(
            channel_id=str(channel),
            route_group=self.route_groups.get(group, group),
            model=str(kwargs.get("model") or slo.get("model") or ""),
            gateway_id=self.gateway_id,
            error_class=error_class,
            latency_ms=int(latency),
            event_time_ms=int(end) if end is not None else None,
            **fields,
        )

    def _emit(self, kwargs, response_obj, start_time, end_time, *, failed: bool) -> None:
        try:
            event = self.event_for(kwargs, response_obj, start_time, end_time, failed=failed)
        except Exception:  # a logging hook must never fail the request
            log.exception("hermes: could not build the request event")
            return
        if event is not None:
            self.emitter.emit(event)
            self.events += 1


def report_unsent(emitter, reader: WeightReader, route_group: str, model: str, gateway_id: str,
                  cls: str, outcome: str) -> None:
    """Reports a request the weights refused (``outcome`` SHED or
    NO_CHANNEL) as demand: an event with that ``dispatch``, named after a
    channel its class would have gone to (any known one when none)."""
    weights = reader.routes().weights.get(cls)
    channel = weights.pick(random.random()) if weights else min(reader.known_channels, default=None)
    if channel is None:
        return
    emitter.emit(
        attempt(
            channel_id=channel,
            route_group=route_group,
            model=model,
            gateway_id=gateway_id,
            error_class="NONE",
            latency_ms=0,
            traffic_class=cls,
            dispatch="SHED" if outcome == "SHED" else "NO_CHANNEL",
        )
    )


class HermesRouting(CustomRoutingStrategyBase):
    """Picks a deployment of the requested model group by Hermes' weights
    for the request's class. Register it with
    ``router.register_plugin(HermesRouting(router, ...))`` (LiteLLM before
    1.110: ``router.set_custom_routing_strategy``).

    ``static`` is the table used until Hermes' first snapshot: model group
    -> {channel: weight} (``*`` for every group); without one, LiteLLM's
    deployments share equally. A request the weights shed, or whose class
    has no deployment with weight, raises :class:`HermesRefused` and is
    reported to Hermes as demand (``dispatch`` SHED or NO_CHANNEL) when an
    ``emitter`` is given. A retry avoids the deployments that already failed
    this request while another has weight.
    """

    def __init__(
        self,
        router: Any,
        redis_url: str,
        *,
        route_groups: Mapping[str, str] | None = None,
        static: Mapping[str, Mapping[str, float]] | None = None,
        class_mapping: Mapping[str, str] | None = None,
        emitter: EventEmitter | None = None,
        gateway_id: str = "litellm",
        stale_after_ms: int = 30_000,
        refresh_s: float = 5.0,
    ):
        self.router = router
        self.redis_url = redis_url
        self.route_groups = dict(route_groups or {})
        self.static = dict(static or {})
        self.class_mapping = dict(class_mapping or {})
        self.emitter = emitter
        self.gateway_id = gateway_id
        self.stale_after_ms = stale_after_ms
        self.refresh_s = refresh_s
        self.readers: dict[str, WeightReader] = {}

    def _deployments(self, model: str) -> list[dict]:
        registry = getattr(self.router, "registry", None)
        if callable(registry):
            try:
                return list(registry().deployments(model))
            except Exception:
                pass
        return list(self.router.get_model_list(model_name=model) or [])

    def reader(self, model: str, deployments: list[dict]) -> WeightReader:
        reader = self.readers.get(model)
        if reader is None:
            channels = {deployment_channel(d) for d in deployments}
            static = self.static.get(model) or self.static.get("*") or {c: 1.0 for c in channels}
            reader = WeightReader(
                self.redis_url,
                self.route_groups.get(model, model),
                static={"*": static},
                known_channels=channels,
                class_mapping=self.class_mapping,
                stale_after_ms=self.stale_after_ms,
                refresh_s=self.refresh_s,
            )
            self.readers[model] = reader
        return reader

    def get_available_deployment(
        self, model, messages=None, input=None, specific_deployment=False, request_kwargs=None
    ):
        deployments = self._deployments(model)
        if not deployments:
            raise ValueError(f"no deployment for model group {model}")
        metadata = _metadata(request_kwargs or {})
        reader = self.reader(model, deployments)
        cls = request_class(metadata, self.class_mapping)
        tried = {str(p.get("deployment_id")) for p in metadata.get("previous_models") or () if isinstance(p, Mapping)}
        by_channel = {deployment_channel(d): d for d in deployments}
        pick = reader.pick(cls)
        for _ in range(3):
            if pick.outcome != "SENT" or pick.channel not in tried:
                break
            weights = reader.routes().weights.get(cls)
            if not weights or set(weights.channels) <= tried:
                break
            pick = reader.pick(cls)
        if pick.outcome == "SENT" and pick.channel in by_channel:
            return by_channel[pick.channel]
        self._report_unsent(model, cls, pick.outcome, reader)
        raise HermesRefused(pick.outcome, model, cls)

    async def async_get_available_deployment(
        self, model, messages=None, input=None, specific_deployment=False, request_kwargs=None
    ):
        return self.get_available_deployment(model, messages, input, specific_deployment, request_kwargs)

    def _report_unsent(self, model: str, cls: str, outcome: str, reader: WeightReader) -> None:
        if self.emitter is not None:
            report_unsent(self.emitter, reader, self.route_groups.get(model, model), model,
                          self.gateway_id, cls, outcome)

    def close(self) -> None:
        for r in self.readers.values():
            r.close()


def _env_json(env: Mapping[str, str], name: str) -> dict:
    raw = env.get(name)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{name} is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object")
    return value


class HermesProxy(HermesLogger):
    """Hermes for the LiteLLM Proxy, as one callback in its ``config.yaml``::

        litellm_settings:
          callbacks: ["hermes_gateway.litellm.proxy_handler"]

    It reports every attempt the Proxy makes (retries and fallbacks
    included, streamed answers once complete) and narrows each pick to one
    deployment by Hermes' weights for the request's class
    (``async_filter_deployments``, which LiteLLM's router runs for every
    callback that overrides it). A retry avoids the deployments that
    already failed the request while another has weight. Until Hermes'
    first snapshot it leaves LiteLLM's own routing alone; when Redis or
    Hermes is away it keeps the last snapshot (stale beats empty). A
    request the weights shed, or whose class no deployment may serve, is
    refused with :class:`HermesRefused` (HTTP 429) and reported as demand.

    Each Proxy worker process builds its own producer and reader on first
    use, so ``--num_workers`` and forking servers work. Settings, from the
    environment (:meth:`from_env`):

    - ``HERMES_BOOTSTRAP_SERVERS`` (required): Kafka for the request events;
      ``HERMES_REQUEST_TOPIC`` (``hermes.requests``),
      ``HERMES_SCHEMA_REGISTRY_URL`` (optional: Confluent framing).
    - ``HERMES_REDIS_URL`` (required): where Hermes publishes weights.
    - ``HERMES_GATEWAY_ID`` (``litellm-proxy-<host>-<pid>``).
    - ``HERMES_ROUTE_GROUPS``: JSON, model group -> route group when they
      differ; ``HERMES_CLASS_MAPPING``: JSON, your labels -> Hermes classes;
      ``HERMES_DEFAULT_CLASS`` (``core``).
    - ``HERMES_STALE_AFTER_MS`` (30000), ``HERMES_REFRESH_S`` (5).
    """

    def __init__(
        self,
        *,
        bootstrap_servers: str | None,
        redis_url: str | None,
        topic: str = "hermes.requests",
        schema_registry_url: str | None = None,
        gateway_id: str | None = None,
        route_groups: Mapping[str, str] | None = None,
        class_mapping: Mapping[str, str] | None = None,
        default_class: str | None = None,
        stale_after_ms: int = 30_000,
        refresh_s: float = 5.0,
    ):
        super().__init__(None, gateway_id or "", route_groups=route_groups, class_mapping=class_mapping)
        self.default_class = default_class
        self.bootstrap_servers = bootstrap_servers
        self.redis_url = redis_url
        self.topic = topic
        self.schema_registry_url = schema_registry_url
        self.fixed_gateway_id = gateway_id
        self.stale_after_ms = stale_after_ms
        self.refresh_s = refresh_s
        self.readers: dict[str, WeightReader] = {}
        self.refused = 0
        self._pid: int | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "HermesProxy":
        e = os.environ if env is None else env
        return cls(
            bootstrap_servers=e.get("HERMES_BOOTSTRAP_SERVERS"),
            redis_url=e.get("HERMES_REDIS_URL"),
            topic=e.get("HERMES_REQUEST_TOPIC", "hermes.requests"),
            schema_registry_url=e.get("HERMES_SCHEMA_REGISTRY_URL") or None,
            gateway_id=e.get("HERMES_GATEWAY_ID") or None,
            route_groups=_env_json(e, "HERMES_ROUTE_GROUPS"),
            class_mapping=_env_json(e, "HERMES_CLASS_MAPPING"),
            default_class=e.get("HERMES_DEFAULT_CLASS") or None,
            stale_after_ms=int(e.get("HERMES_STALE_AFTER_MS", "30000")),
            refresh_s=float(e.get("HERMES_REFRESH_S", "5")),
        )

    def _ensure(self) -> bool:
        """This process's producer and readers (a forked worker builds its
        own). False while the required settings are missing."""
        if self._pid == os.getpid():
            return True
        with self._lock:
            if self._pid == os.getpid():
                return True
            if not self.bootstrap_servers or not self.redis_url:
                log.error("hermes: HERMES_BOOTSTRAP_SERVERS and HERMES_REDIS_URL must be set; not routing by Hermes")
                return False
            self.emitter = EventEmitter(self.bootstrap_servers, self.topic,
                                        schema_registry_url=self.schema_registry_url)
            self.gateway_id = self.fixed_gateway_id or f"litellm-proxy-{socket.gethostname()}-{os.getpid()}"
            self.readers = {}
            self._pid = os.getpid()
            return True

    def _emit(self, kwargs, response_obj, start_time, end_time, *, failed: bool) -> None:
        if self._ensure():
            super()._emit(kwargs, response_obj, start_time, end_time, failed=failed)

    def reader(self, model: str, deployments: list) -> WeightReader:
        reader = self.readers.get(model)
        if reader is None:
            reader = WeightReader(
                self.redis_url,
                self.route_groups.get(model, model),
                known_channels={deployment_channel(d) for d in deployments},
                class_mapping=self.class_mapping,
                stale_after_ms=self.stale_after_ms,
                refresh_s=self.refresh_s,
            )
            self.readers[model] = reader
        return reader

    async def async_filter_deployments(self, model, healthy_deployments, messages=None, request_kwargs=None,
                                       parent_otel_span=None):
        if not healthy_deployments or not self._ensure():
            return healthy_deployments
        reader = self.reader(model, healthy_deployments)
        if reader.routes().source != "snapshot":
            # Before Hermes' first snapshot: LiteLLM's own routing.
            return healthy_deployments
        request = request_kwargs or {}
        metadata = _metadata(request)
        cls = request_class(metadata, self.class_mapping, self.default_class)
        failed = {str(i) for key in ("_retry_skipped_deployment_ids", "_excluded_deployment_ids")
                  for i in (request.get(key) or ())}
        failed |= {str(p.get("deployment_id")) for p in metadata.get("previous_models") or ()
                   if isinstance(p, Mapping)}
        by_channel = {deployment_channel(d): d for d in healthy_deployments}
        avoid = {c for c, d in by_channel.items() if str((d.get("model_info") or {}).get("id")) in failed}
        pick = reader.pick_among(cls, set(by_channel), avoid)
        if pick.outcome == "SENT":
            return [by_channel[pick.channel]]
        self.refused += 1
        self._report_unsent(model, cls, pick.outcome, reader)
        raise HermesRefused(pick.outcome, model, cls)

    def _report_unsent(self, model: str, cls: str, outcome: str, reader: WeightReader) -> None:
        report_unsent(self.emitter, reader, self.route_groups.get(model, model), model,
                      self.gateway_id, cls, outcome)


#: The callback the LiteLLM Proxy loads (``litellm_settings.callbacks:
#: ["hermes_gateway.litellm.proxy_handler"]``), configured by environment
#: variables (:class:`HermesProxy`). Nothing connects before its first use.
proxy_handler = HermesProxy.from_env()
