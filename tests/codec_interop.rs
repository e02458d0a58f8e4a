//! Our Avro bytes are standard Avro: the reference implementation
//! (apache-avro) reads what we write and we read what it writes, for both the
//! request event and the alert event.

use apache_avro::types::Value;
use hermes::alert::AlertEvent;
use hermes::codec::{
    Decoder, Encoder, NoRegistry, WireFormat, ALERT_EVENT_SCHEMA_JSON, REQUEST_EVENT_SCHEMA_JSON,
};
mod support;
use support::{sample_alert, sample_event};

fn field<'a>(record: &'a Value, name: &str) -> &'a Value {
    match record {
        Value::Record(fields) => &fields.iter().find(|(n, _)| n == name).unwrap().1,
        other => panic!("not a record: {other:?}"),
    }
}

#[test]
fn reference_implementation_reads_our_request_events() {
    let schema = apache_avro::Schema::parse_str(REQUEST_EVENT_SCHEMA_JSON).unwrap();
    let mut bytes = Vec::new();
    Encoder::default()
        .encode_plain(&sample_event(), &mut bytes)
        .unwrap();
    let value = apache_avro::from_avro_datum(&schema, &mut bytes.as_slice(), None).unwrap();
    assert_eq!(field(&value, "channel_id"), &Value::String("free-a".into()));
    assert_eq!(
        field(&value, "event_time_ms"),
        &Value::TimestampMillis(1_764_000_123_456)
    );
    assert_eq!(
        field(&value, "error_class"),
        &Value::Enum(5, "RATE_LIMITED".into())
    );
    assert_eq!(
        field(&value, "ttfb_ms"),
        &Value::Union(0, Box::new(Value::Null))
    );
    assert_eq!(
        field(&value, "quota_remaining"),
        &Value::Union(1, Box::new(Value::Long(77)))
    );
    assert_eq!(field(&value, "is_probe"), &Value::Boolean(true));
}

#[test]
fn we_read_request_events_written_by_the_reference_implementation() {
    let schema = apache_avro::Schema::parse_str(REQUEST_EVENT_SCHEMA_JSON).unwrap();
    let value = apache_avro::to_value(sample_event())
        .unwrap()
        .resolve(&schema)
        .unwrap();
    let bytes = apache_avro::to_avro_datum(&schema, value).unwrap();
    let decoded = Decoder::new(WireFormat::Plain)
        .decode(&bytes, &NoRegistry)
        .unwrap();
    assert_eq!(decoded, sample_event());
}

#[test]
fn alert_events_interoperate() {
    let alert = sample_alert();
    let schema = apache_avro::Schema::parse_str(ALERT_EVENT_SCHEMA_JSON).unwrap();
    let bytes = alert.to_avro().unwrap();
    let value = apache_avro::from_avro_datum(&schema, &mut bytes.as_slice(), None).unwrap();
    assert_eq!(field(&value, "severity"), &Value::Enum(0, "P1".into()));
    assert_eq!(field(&value, "kind"), &Value::Enum(0, "TRANSITION".into()));
    let back = apache_avro::to_avro_datum(&schema, value).unwrap();
    assert_eq!(AlertEvent::from_avro(&back).unwrap(), alert);
}
