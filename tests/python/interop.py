#!/usr/bin/env python3
"""Interop of Tributary's change events with Confluent's Python client.

Two directions, driven by schemas/tests/interop.rs:

  consume  reads the events Tributary produced to a topic with
           confluent-kafka's AvroDeserializer (fastavro underneath) and
           checks every decoded key and value against an expectation file
           that the Rust test wrote; exits non-zero naming the first
           difference.
  produce  writes Debezium PostgreSQL envelopes (schema files copied from a
           real Debezium 2.x connector's output) with AvroSerializer, which
           registers them under <topic>-key / <topic>-value; the Rust test
           then decodes them with Tributary's decoder.

Needs: pip install 'confluent-kafka[avro,schemaregistry]'
"""

import argparse
import base64
import datetime
import decimal
import json
import sys
import uuid

from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

EPOCH = datetime.datetime(1970, 1, 1)
EPOCH_UTC = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def normalize(value):
    """Decoded Avro values (with fastavro's logical types) as plain JSON."""
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, datetime.datetime):
        base = EPOCH_UTC if value.tzinfo is not None else EPOCH
        delta = value - base
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if isinstance(value, datetime.date):
        return (value - EPOCH.date()).days
    if isinstance(value, datetime.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return value


def consume(args):
    with open(args.expect, encoding="utf-8") as f:
        expected = json.load(f)
    registry = SchemaRegistryClient({"url": args.registry})
    deserializer = AvroDeserializer(registry)
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap,
        "group.id": "interop-" + uuid.uuid4().hex,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe([args.topic])
    got = []
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=args.timeout)
    try:
        while len(got) < len(expected) and datetime.datetime.now() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                print(f"consumer error: {msg.error()}", file=sys.stderr)
                return 2
            key = msg.key()
            value = msg.value()
            key = None if key is None else deserializer(key, SerializationContext(args.topic, MessageField.KEY))
            value = None if value is None else deserializer(value, SerializationContext(args.topic, MessageField.VALUE))
            got.append({"key": normalize(key), "value": normalize(value)})
    finally:
        consumer.close()
    if len(got) != len(expected):
        print(f"expected {len(expected)} records, read {len(got)}", file=sys.stderr)
        return 1
    for i, (want, have) in enumerate(zip(expected, got)):
        for part in ("key", "value"):
            w, h = want[part], have[part]
            if w is None or h is None:
                if w != h:
                    print(f"record {i} {part}: expected {w!r}, got {h!r}", file=sys.stderr)
                    return 1
                continue
            # Only the fields the expectation names are compared (the source
            # block has a version and timestamps nobody needs to pin).
            for path, wv in flatten(w):
                hv = lookup(h, path)
                if hv != wv:
                    print(f"record {i} {part}.{'.'.join(path)}: expected {wv!r}, got {hv!r}", file=sys.stderr)
                    return 1
    print(f"interop consume: {len(got)} records match")
    return 0


def flatten(obj, path=()):
    if isinstance(obj, dict) and obj:
        for k, v in obj.items():
            yield from flatten(v, path + (k,))
    else:
        yield path, obj


def lookup(obj, path):
    for p in path:
        if not isinstance(obj, dict) or p not in obj:
            return "<missing>"
        obj = obj[p]
    return obj


def pg_row(row_id, email):
    return {
        "id": row_id,
        "first_name": "Sally",
        "email": email,
        "small": -3,
        "amount": decimal.Decimal("123.45"),
        "price": {"scale": 3, "value": (-12345).to_bytes(2, "big", signed=True)},
        "created_at": "2024-06-10T08:13:20.123456+02:00",
        "updated_at": 1_718_000_000_000_000,
        "birthday": 19_876,
        "alarm": 45_296_000_001,
        "data": '{"a":1}',
        "uid": "01234567-89ab-cdef-0123-456789abcdef",
        "tags": ["a", None],
        "status": "vip",
        "active": True,
        "wait": "P1Y2M3DT4H5M6.5S",
    }


def produce(args):
    with open(f"{args.schema_dir}/postgres.value.avsc", encoding="utf-8") as f:
        value_schema = f.read()
    with open(f"{args.schema_dir}/postgres.key.avsc", encoding="utf-8") as f:
        key_schema = f.read()
    registry = SchemaRegistryClient({"url": args.registry})
    value_ser = AvroSerializer(registry, value_schema)
    key_ser = AvroSerializer(registry, key_schema)
    producer = Producer({"bootstrap.servers": args.bootstrap})
    source = {
        "version": "2.7.3.Final",
        "connector": "postgresql",
        "name": "dbserver1",
        "ts_ms": 1_718_000_000_999,
        "snapshot": "false",
        "db": "inventory",
        "sequence": '["24023128","24023184"]',
        "ts_us": None,
        "ts_ns": None,
        "schema": "inventory",
        "table": "customers",
        "txId": 555,
        "lsn": 24_023_184,
        "xmin": None,
    }
    events = [
        ("c", None, pg_row(1001, "sally@example.com")),
        ("u", pg_row(1001, "sally@example.com"), pg_row(1001, None)),
        ("d", pg_row(1001, None), None),
    ]
    for op, before, after in events:
        envelope = {
            "before": before,
            "after": after,
            "source": source,
            "transaction": {"id": "555:24023184", "total_order": 1, "data_collection_order": 1},
            "op": op,
            "ts_ms": 1_718_000_001_000,
            "ts_us": None,
            "ts_ns": None,
        }
        key = key_ser({"id": 1001}, SerializationContext(args.topic, MessageField.KEY))
        value = value_ser(envelope, SerializationContext(args.topic, MessageField.VALUE))
        producer.produce(args.topic, key=key, value=value)
    # Debezium's tombstone after the delete.
    producer.produce(args.topic, key=key, value=None)
    remaining = producer.flush(30)
    if remaining:
        print(f"{remaining} records not delivered", file=sys.stderr)
        return 1
    print(f"interop produce: {len(events) + 1} records written")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["consume", "produce"])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--registry", default="http://127.0.0.1:8081/apis/ccompat/v7")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--expect", help="expectation JSON (consume)")
    parser.add_argument("--schema-dir", help="folder of the Debezium .avsc files (produce)")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    return consume(args) if args.mode == "consume" else produce(args)


if __name__ == "__main__":
    sys.exit(main())
