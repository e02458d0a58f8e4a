"""Request events: one per upstream attempt, as ``schemas/request_event.avsc``
defines them. :func:`attempt` fills the defaults and checks the enums, so a
gateway cannot send an event the schema would refuse."""

from __future__ import annotations

import json
import time
import uuid
from importlib import resources

from .snapshot import CLASSES


def load_schema() -> str:
    """The request event schema, as the text a registry stores."""
    return resources.files(__package__).joinpath("schemas/request_event.avsc").read_text()


_SCHEMA = json.loads(load_schema())
_FIELDS = {f["name"]: f for f in _SCHEMA["fields"]}


def _symbols(name: str) -> tuple[str, ...]:
    return tuple(_FIELDS[name]["type"]["symbols"])


ERROR_CLASSES = _symbols("error_class")
FINISH_REASONS = _symbols("finish_reason")
DISPATCHES = _symbols("dispatch")
assert _symbols("traffic_class") == CLASSES


def error_class_for_status(status: int) -> str:
    """The error class of an HTTP status an upstream answered with."""
    if 200 <= status < 400:
        return "NONE"
    if status == 429:
        return "RATE_LIMITED"
    if status >= 500:
        return "SERVER_ERROR"
    return "CLIENT_ERROR"


def attempt(
    *,
    channel_id: str,
    route_group: str,
    model: str,
    gateway_id: str,
    error_class: str,
    latency_ms: int,
    event_time_ms: int | None = None,
    event_id: str | None = None,
    **fields,
) -> dict:
    """One request event as a dict ready for Avro encoding.

    The required fields are keyword arguments; any other field of the schema
    may be given (``http_status``, ``output_tokens``, ``finish_reason``,
    ``truncated``, ``schema_valid``, ``ttfb_ms``, ``traffic_class``, ...) and
    the rest take the schema's defaults. Raises ``ValueError`` for an
    unknown field or enum symbol.
    """
    unknown = set(fields) - set(_FIELDS)
    if unknown:
        raise ValueError(f"not fields of the request event: {sorted(unknown)}")
    event = {
        "event_id": event_id or uuid.uuid4().hex,
        "event_time_ms": int(event_time_ms if event_time_ms is not None else time.time() * 1000),
        "gateway_id": gateway_id,
        "channel_id": channel_id,
        "route_group": route_group,
        "model": model,
        "error_class": error_class,
        "latency_ms": max(0, int(latency_ms)),
    }
    for name, f in _FIELDS.items():
        if name not in event:
            event[name] = fields.get(name, f.get("default"))
    for name, allowed in (
        ("error_class", ERROR_CLASSES),
        ("finish_reason", FINISH_REASONS),
        ("dispatch", DISPATCHES),
        ("traffic_class", CLASSES),
    ):
        if event[name] not in allowed:
            raise ValueError(f"{name}: {event[name]!r} is not one of {allowed}")
    return event
