"""Avro schema resolution by a second implementation (fastavro, what
confluent-kafka's AvroDeserializer uses): a datum written with each current
schema is read with every released one as the reader, and the other way
round. Usage: schema_resolution.py REPO_ROOT. Exits non-zero on the first
failure, naming the pair and the direction."""

import glob
import io
import json
import os
import sys

import fastavro

root = sys.argv[1]
# The fields a datum must carry under every released schema (the required
# ones of the first release; every later field has a default).
RECORDS = {
    "request_event": dict(event_id="e-1", event_time_ms=1_764_000_123_456, gateway_id="gw-1",
                          channel_id="free-a", route_group="chat", model="m-1",
                          traffic_class="BATCH", error_class="RATE_LIMITED", latency_ms=31),
    "alert_event": dict(alert_id="a-1", event_time_ms=1_764_000_123_456, route_group="chat",
                        kind="OSCILLATION", severity="P2", reason="repeated_incidents(penalty=2.76)",
                        message="oscillating"),
}

checked = 0
for name, record in RECORDS.items():
    current = fastavro.parse_schema(json.load(open(os.path.join(root, "schemas", name + ".avsc"))))
    released = sorted(glob.glob(os.path.join(root, "schemas", "released", name + ".*.avsc")))
    if not released:
        sys.exit(f"{name}: no released schema")
    for path in released:
        old = fastavro.parse_schema(json.load(open(path)))
        for writer, reader, direction in [(current, old, "old reader / new writer"),
                                          (old, current, "new reader / old writer")]:
            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, writer, record)
            buf.seek(0)
            try:
                out = fastavro.schemaless_reader(buf, writer, reader, return_record_name=False)
                out = {k: (int(v.timestamp() * 1000) if hasattr(v, "timestamp") else v) for k, v in out.items()}
            except Exception as e:  # noqa: BLE001 - report any resolution failure
                sys.exit(f"{name} vs {os.path.basename(path)}, {direction}: {e}")
            for k, v in record.items():
                if out.get(k) != v:
                    sys.exit(f"{name} vs {os.path.basename(path)}, {direction}: {k} = {out.get(k)!r}, wrote {v!r}")
            checked += 1
print(f"ok: {checked} resolutions (fastavro {fastavro.__version__})")
