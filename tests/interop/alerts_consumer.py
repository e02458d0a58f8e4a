"""Reads Hermes' alert topic as any registry-aware consumer would:
confluent-kafka's DeserializingConsumer with an AvroDeserializer that looks
each record's schema id up in the Schema Registry, and a UTF-8 key.

    python3 alerts_consumer.py BOOTSTRAP REGISTRY_URL TOPIC MIN_RECORDS

Prints one JSON object per alert ({"key": ..., "value": {...}}) and exits 0
once at least MIN_RECORDS were read and the topic is quiet for 3 s; exits 1
on any record that does not deserialize. Used by tests/service.rs.
"""
import json
import sys
import time

from confluent_kafka import DeserializingConsumer, TopicPartition, OFFSET_BEGINNING
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import StringDeserializer


def main():
    bootstrap, registry, topic, want = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    consumer = DeserializingConsumer({
        "bootstrap.servers": bootstrap,
        "group.id": "hermes-interop-python",
        "enable.auto.commit": False,
        "key.deserializer": StringDeserializer("utf_8"),
        "value.deserializer": AvroDeserializer(SchemaRegistryClient({"url": registry})),
    })
    meta = consumer.list_topics(topic, timeout=30)
    parts = sorted(meta.topics[topic].partitions)
    # Assigned, not subscribed: no group join is needed to read a topic.
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    read, quiet_since, deadline = 0, time.time(), time.time() + 60
    while time.time() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            if read >= want and time.time() - quiet_since > 3:
                break
            continue
        if msg.error():
            print(f"consumer error: {msg.error()}", file=sys.stderr)
            continue
        print(json.dumps({"key": msg.key(), "value": msg.value()}, default=str))
        read += 1
        quiet_since = time.time()
    consumer.close()
    if read < want:
        print(f"read {read} alerts, wanted at least {want}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
