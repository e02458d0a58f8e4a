"""The package's copies of the schemas are the repository's, byte for byte;
events it builds are valid Avro of that schema."""

import io
import json
import os

import fastavro
import pytest

from hermes_gateway import attempt, error_class_for_status
from hermes_gateway.event import load_schema

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PKG = os.path.join(os.path.dirname(__file__), "..", "hermes_gateway", "schemas")


@pytest.mark.parametrize("name", ["request_event.avsc", "weight_snapshot.schema.json"])
def test_schema_copies_are_the_repositorys(name):
    with open(os.path.join(REPO, "schemas", name), "rb") as a, open(os.path.join(PKG, name), "rb") as b:
        assert a.read() == b.read(), f"copy {name} from schemas/ into clients/python/hermes_gateway/schemas/"


def test_an_attempt_round_trips_through_avro_with_the_schemas_defaults():
    ev = attempt(channel_id="free-a", route_group="chat", model="m", gateway_id="gw-1",
                 error_class="NONE", latency_ms=812, http_status=200, finish_reason="LENGTH", truncated=True)
    schema = fastavro.parse_schema(json.loads(load_schema()))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, ev)
    back = fastavro.schemaless_reader(io.BytesIO(buf.getvalue()), schema)
    assert back["truncated"] is True and back["finish_reason"] == "LENGTH"
    assert back["output_tokens"] == -1, "not reported unless given"
    assert back["traffic_class"] == "CORE" and back["dispatch"] == "SENT"


def test_bad_fields_and_symbols_are_refused():
    base = dict(channel_id="c", route_group="g", model="m", gateway_id="gw", latency_ms=1)
    with pytest.raises(ValueError, match="error_class"):
        attempt(error_class="TIMEOUT", **base)
    with pytest.raises(ValueError, match="not fields"):
        attempt(error_class="NONE", outptu_tokens=3, **base)


def test_status_classes():
    assert [error_class_for_status(s) for s in (200, 429, 503, 404)] == [
        "NONE", "RATE_LIMITED", "SERVER_ERROR", "CLIENT_ERROR"]
