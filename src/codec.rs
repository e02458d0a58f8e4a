//! Avro wire codec for request events (decode on the hot path, encode for the
//! simulator, replay files and tests).
//!
//! Two framings arrive on the request topic:
//! - **Confluent**: magic byte `0`, a 4-byte big-endian schema id, then the
//!   datum written with that (writer) schema. The writer schema comes from a
//!   [`SchemaLookup`]; the service backs it with a Schema Registry client.
//! - **Plain**: a bare datum written with the current
//!   `schemas/request_event.avsc`.
//!
//! The datum is decoded with the *writer's* schema straight into the borrowed
//! [`RequestEvent`]; serde's field matching performs the schema resolution
//! (missing fields take their defaults, unknown fields are skipped). That is
//! what keeps decoding zero-copy and near 3 M records/s (see `benches/`).
//!
//! Nothing here panics on bad input: every failure is a [`CodecError`] whose
//! `Display` is the reason written to the dead-letter topic.

use crate::event::RequestEvent;
use serde_avro_fast::Schema;
use std::sync::OnceLock;

/// The request event schema this build was compiled with (the contract).
pub const REQUEST_EVENT_SCHEMA_JSON: &str = include_str!("../schemas/request_event.avsc");
/// The alert event schema this build was compiled with.
pub const ALERT_EVENT_SCHEMA_JSON: &str = include_str!("../schemas/alert_event.avsc");

/// Confluent wire-format magic byte.
pub const CONFLUENT_MAGIC: u8 = 0;
const CONFLUENT_HEADER_LEN: usize = 5;

fn parse_builtin(json: &str, what: &str) -> Schema {
    match json.parse() {
        Ok(schema) => schema,
        // The schema is compiled in and covered by tests; failing here is a
        // build defect, not an input error.
        Err(e) => panic!("built-in {what} schema does not parse: {e}"),
    }
}

/// The parsed current request event schema.
pub fn request_schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| parse_builtin(REQUEST_EVENT_SCHEMA_JSON, "request event"))
}

/// The parsed current alert event schema.
pub fn alert_schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| parse_builtin(ALERT_EVENT_SCHEMA_JSON, "alert event"))
}

/// How records on a topic are framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WireFormat {
    /// Always Confluent framing; anything else is an error.
    Confluent,
    /// Always a bare datum in the current schema.
    Plain,
    /// Confluent when the first byte is the magic byte `0`, else plain. A
    /// plain datum can only start with `0` if its `event_id` is empty, which
    /// validation rejects anyway.
    Auto,
}

/// Writer schemas by Confluent schema id.
///
/// Lookups on the hot path must be cheap, so implementations answer from
/// memory; the service fetches unknown ids from the registry (off the engine)
/// and retries the record.
pub trait SchemaLookup {
    fn writer_schema(&self, schema_id: u32) -> Option<&Schema>;
}

/// A registry that knows no ids (plain-datum deployments and tests).
pub struct NoRegistry;

impl SchemaLookup for NoRegistry {
    fn writer_schema(&self, _: u32) -> Option<&Schema> {
        None
    }
}

/// An in-memory id → schema map; the service's registry client fills one.
#[derive(Default)]
pub struct SchemaCache {
    schemas: ahash::AHashMap<u32, Schema>,
}

impl SchemaCache {
    /// Parses and stores a writer schema under its registry id.
    pub fn insert_json(&mut self, schema_id: u32, json: &str) -> Result<(), CodecError> {
        let schema: Schema = json.parse().map_err(|e| CodecError::BadWriterSchema {
            schema_id,
            reason: format!("{e}"),
        })?;
        self.schemas.insert(schema_id, schema);
        Ok(())
    }
}

impl SchemaLookup for SchemaCache {
    fn writer_schema(&self, schema_id: u32) -> Option<&Schema> {
        self.schemas.get(&schema_id)
    }
}

/// Why a record could not be turned into an event. The `Display` text is the
/// dead-letter reason, so it names what was wrong without echoing payloads.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CodecError {
    #[error("empty record")]
    Empty,
    #[error("wrong magic byte {found:#04x} (Confluent framing starts with 0x00)")]
    WrongMagicByte { found: u8 },
    #[error("record of {len} bytes is shorter than the 5-byte Confluent header")]
    TruncatedHeader { len: usize },
    #[error("unknown schema id {schema_id}")]
    UnknownSchemaId { schema_id: u32 },
    #[error("writer schema {schema_id} does not parse: {reason}")]
    BadWriterSchema { schema_id: u32, reason: String },
    #[error("truncated datum: {reason}")]
    TruncatedDatum { reason: String },
    #[error("malformed datum: {reason}")]
    Malformed { reason: String },
    #[error("invalid event: field `{field}` {reason}")]
    Invalid {
        field: &'static str,
        reason: &'static str,
    },
}

impl CodecError {
    /// A short, bounded label for metrics (never the free-text reason).
    pub fn kind(&self) -> &'static str {
        match self {
            CodecError::Empty => "empty",
            CodecError::WrongMagicByte { .. } => "wrong_magic_byte",
            CodecError::TruncatedHeader { .. } => "truncated_header",
            CodecError::UnknownSchemaId { .. } => "unknown_schema_id",
            CodecError::BadWriterSchema { .. } => "bad_writer_schema",
            CodecError::TruncatedDatum { .. } => "truncated_datum",
            CodecError::Malformed { .. } => "malformed",
            CodecError::Invalid { .. } => "invalid",
        }
    }
}

fn datum_error(e: serde_avro_fast::de::DeError) -> CodecError {
    let reason = e.to_string();
    // serde_avro_fast reports running off the end of the slice in these words.
    if reason.contains("end of slice") || reason.contains("Reached EOF") {
        CodecError::TruncatedDatum { reason }
    } else {
        CodecError::Malformed { reason }
    }
}

/// Decodes request events. Cheap to share; holds no per-record state.
pub struct Decoder {
    format: WireFormat,
}

impl Decoder {
    pub fn new(format: WireFormat) -> Self {
        Decoder { format }
    }

    /// Decodes one record. The event borrows its strings from `bytes`.
    pub fn decode<'a>(
        &self,
        bytes: &'a [u8],
        registry: &dyn SchemaLookup,
    ) -> Result<RequestEvent<'a>, CodecError> {
        let first = *bytes.first().ok_or(CodecError::Empty)?;
        let confluent = match self.format {
            WireFormat::Confluent => true,
            WireFormat::Plain => false,
            WireFormat::Auto => first == CONFLUENT_MAGIC,
        };
        let event = if confluent {
            if first != CONFLUENT_MAGIC {
                return Err(CodecError::WrongMagicByte { found: first });
            }
            let header: [u8; CONFLUENT_HEADER_LEN] = bytes
                .get(..CONFLUENT_HEADER_LEN)
                .and_then(|h| h.try_into().ok())
                .ok_or(CodecError::TruncatedHeader { len: bytes.len() })?;
            let schema_id = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
            let schema = registry
                .writer_schema(schema_id)
                .ok_or(CodecError::UnknownSchemaId { schema_id })?;
            serde_avro_fast::from_datum_slice(&bytes[CONFLUENT_HEADER_LEN..], schema)
                .map_err(datum_error)?
        } else {
            serde_avro_fast::from_datum_slice(bytes, request_schema()).map_err(datum_error)?
        };
        validate(&event)?;
        Ok(event)
    }
}

/// The last millisecond of the year 9999: later event times are invalid
/// (and event-time arithmetic stays far from overflow).
pub const MAX_EVENT_TIME_MS: i64 = 253_402_300_799_999;

/// Rejects events that decode but cannot be meaningful; such values would
/// poison windows (negative latency) or route nowhere (empty ids).
pub fn validate(event: &RequestEvent<'_>) -> Result<(), CodecError> {
    let invalid = |field, reason| Err(CodecError::Invalid { field, reason });
    if event.event_id.is_empty() {
        return invalid("event_id", "is empty");
    }
    if event.channel_id.is_empty() {
        return invalid("channel_id", "is empty");
    }
    if event.route_group.is_empty() {
        return invalid("route_group", "is empty");
    }
    if event.event_time_ms <= 0 {
        return invalid("event_time_ms", "is not a positive epoch time");
    }
    if event.event_time_ms > MAX_EVENT_TIME_MS {
        return invalid("event_time_ms", "is after the year 9999");
    }
    if event.latency_ms < 0 {
        return invalid("latency_ms", "is negative");
    }
    if event.ttfb_ms.is_some_and(|t| t < 0) {
        return invalid("ttfb_ms", "is negative");
    }
    if event.attempt < 0 {
        return invalid("attempt", "is negative");
    }
    if event.input_tokens < 0 {
        return invalid("input_tokens", "is negative");
    }
    if event.output_tokens < crate::event::OUTPUT_TOKENS_UNKNOWN {
        return invalid("output_tokens", "is negative (-1 alone means not reported)");
    }
    if !event.cost.is_finite() || event.cost < 0.0 {
        return invalid("cost", "is negative or not finite");
    }
    Ok(())
}

/// Encodes request events in the current schema. Reuses its buffer.
pub struct Encoder {
    config: serde_avro_fast::ser::SerializerConfig<'static>,
}

impl Default for Encoder {
    fn default() -> Self {
        Encoder {
            config: serde_avro_fast::ser::SerializerConfig::new(request_schema()),
        }
    }
}

impl Encoder {
    /// Appends a bare datum to `out`.
    pub fn encode_plain(
        &mut self,
        event: &RequestEvent<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        let buf = std::mem::take(out);
        *out = serde_avro_fast::to_datum(event, buf, &mut self.config).map_err(|e| {
            CodecError::Malformed {
                reason: format!("cannot encode: {e}"),
            }
        })?;
        Ok(())
    }

    /// Appends a Confluent-framed record (magic byte, schema id, datum).
    pub fn encode_confluent(
        &mut self,
        event: &RequestEvent<'_>,
        schema_id: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        out.push(CONFLUENT_MAGIC);
        out.extend_from_slice(&schema_id.to_be_bytes());
        self.encode_plain(event, out)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::event::*;

    pub(crate) fn sample_event() -> RequestEvent<'static> {
        RequestEvent {
            event_id: "ev-1",
            event_time_ms: 1_764_000_000_000,
            gateway_id: "gw-1",
            channel_id: "free-a",
            route_group: "chat",
            model: "m-1",
            traffic_class: TrafficClass::Batch,
            attempt: 1,
            http_status: 200,
            error_class: ErrorClass::None,
            latency_ms: 1234,
            ttfb_ms: Some(210),
            input_tokens: 900,
            output_tokens: 540,
            finish_reason: FinishReason::Stop,
            truncated: false,
            schema_valid: Some(true),
            replacement_chars: 0,
            is_probe: false,
            cost: 0.0042,
            quota_remaining: Some(12_000),
            trace_id: Some("trace-9"),
            dispatch: Dispatch::Sent,
        }
    }

    fn plain(event: &RequestEvent<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        Encoder::default().encode_plain(event, &mut out).unwrap();
        out
    }

    #[test]
    fn plain_round_trip() {
        let event = sample_event();
        let bytes = plain(&event);
        let decoded = Decoder::new(WireFormat::Plain)
            .decode(&bytes, &NoRegistry)
            .unwrap();
        assert_eq!(decoded, event);
    }

    #[test]
    fn confluent_round_trip_and_auto_detection() {
        let event = sample_event();
        let mut bytes = Vec::new();
        Encoder::default()
            .encode_confluent(&event, 7, &mut bytes)
            .unwrap();
        let mut registry = SchemaCache::default();
        registry.insert_json(7, REQUEST_EVENT_SCHEMA_JSON).unwrap();
        for format in [WireFormat::Confluent, WireFormat::Auto] {
            let decoded = Decoder::new(format).decode(&bytes, &registry).unwrap();
            assert_eq!(decoded, event);
        }
        // Auto also takes a plain datum.
        let plain_bytes = plain(&event);
        let decoded = Decoder::new(WireFormat::Auto)
            .decode(&plain_bytes, &registry)
            .unwrap();
        assert_eq!(decoded, event);
    }

    /// The v0 schema an older gateway writes: no quality/quota/trace fields.
    const OLDER_WRITER: &str = r#"{"type":"record","name":"RequestEvent","namespace":"hermes.v1","fields":[
        {"name":"event_id","type":"string"},
        {"name":"event_time_ms","type":{"type":"long","logicalType":"timestamp-millis"}},
        {"name":"gateway_id","type":"string"},
        {"name":"channel_id","type":"string"},
        {"name":"route_group","type":"string"},
        {"name":"model","type":"string"},
        {"name":"traffic_class","type":{"type":"enum","name":"TrafficClass","symbols":["INTERACTIVE","CORE","BATCH","EXPERIMENTAL"]}},
        {"name":"attempt","type":"int"},
        {"name":"http_status","type":"int"},
        {"name":"error_class","type":{"type":"enum","name":"ErrorClass","symbols":["NONE","CONNECT_ERROR","CONNECT_TIMEOUT","READ_TIMEOUT","CONNECTION_RESET","RATE_LIMITED","SERVER_ERROR","CLIENT_ERROR","CANCELLED"]}},
        {"name":"latency_ms","type":"int"},
        {"name":"output_tokens","type":"int"}
    ]}"#;

    #[derive(serde::Serialize)]
    struct OlderEvent<'a> {
        event_id: &'a str,
        event_time_ms: i64,
        gateway_id: &'a str,
        channel_id: &'a str,
        route_group: &'a str,
        model: &'a str,
        traffic_class: TrafficClass,
        attempt: i32,
        http_status: i32,
        error_class: ErrorClass,
        latency_ms: i32,
        output_tokens: i32,
    }

    #[test]
    fn older_writer_schema_fills_defaults() {
        let schema: Schema = OLDER_WRITER.parse().unwrap();
        let old = OlderEvent {
            event_id: "ev-old",
            event_time_ms: 1_764_000_000_000,
            gateway_id: "gw-old",
            channel_id: "paid-a",
            route_group: "chat",
            model: "m",
            traffic_class: TrafficClass::Interactive,
            attempt: 0,
            http_status: 503,
            error_class: ErrorClass::ServerError,
            latency_ms: 88,
            output_tokens: 0,
        };
        let mut bytes = vec![0, 0, 0, 0, 3];
        bytes.extend(
            serde_avro_fast::to_datum_vec(
                &old,
                &mut serde_avro_fast::ser::SerializerConfig::new(&schema),
            )
            .unwrap(),
        );
        let mut registry = SchemaCache::default();
        registry.insert_json(3, OLDER_WRITER).unwrap();
        let ev = Decoder::new(WireFormat::Confluent)
            .decode(&bytes, &registry)
            .unwrap();
        assert_eq!(ev.channel_id, "paid-a");
        assert_eq!(ev.error_class, ErrorClass::ServerError);
        assert_eq!(ev.latency_ms, 88);
        // Fields the older writer lacks take the reader's defaults.
        assert_eq!(ev.ttfb_ms, None);
        assert_eq!(ev.input_tokens, 0);
        assert_eq!(ev.finish_reason, FinishReason::Unknown);
        assert!(!ev.truncated && !ev.is_probe);
        assert_eq!(ev.schema_valid, None);
        assert_eq!(ev.replacement_chars, 0);
        assert_eq!(ev.quota_remaining, None);
        assert_eq!(ev.trace_id, None);
        assert_eq!(
            ev.dispatch,
            Dispatch::Sent,
            "an older gateway's events are attempts"
        );
    }

    /// A producer that never sends `output_tokens`: its successes are read
    /// as "not reported", never as empty answers.
    #[test]
    fn a_writer_without_output_tokens_is_not_read_as_empty_answers() {
        let fields = OLDER_WRITER.replace(
            ",\n        {\"name\":\"output_tokens\",\"type\":\"int\"}",
            "",
        );
        assert!(!fields.contains("output_tokens"));
        let schema: Schema = fields.parse().unwrap();
        #[derive(serde::Serialize)]
        struct NoTokens<'a> {
            event_id: &'a str,
            event_time_ms: i64,
            gateway_id: &'a str,
            channel_id: &'a str,
            route_group: &'a str,
            model: &'a str,
            traffic_class: TrafficClass,
            attempt: i32,
            http_status: i32,
            error_class: ErrorClass,
            latency_ms: i32,
        }
        let ok = NoTokens {
            event_id: "ev-1",
            event_time_ms: 1_764_000_000_000,
            gateway_id: "gw",
            channel_id: "paid-a",
            route_group: "chat",
            model: "m",
            traffic_class: TrafficClass::Core,
            attempt: 0,
            http_status: 200,
            error_class: ErrorClass::None,
            latency_ms: 120,
        };
        let mut bytes = vec![0, 0, 0, 0, 4];
        bytes.extend(
            serde_avro_fast::to_datum_vec(
                &ok,
                &mut serde_avro_fast::ser::SerializerConfig::new(&schema),
            )
            .unwrap(),
        );
        let mut registry = SchemaCache::default();
        registry.insert_json(4, &fields).unwrap();
        let ev = Decoder::new(WireFormat::Confluent)
            .decode(&bytes, &registry)
            .unwrap();
        assert_eq!(ev.output_tokens, crate::event::OUTPUT_TOKENS_UNKNOWN);
        assert_eq!(ev.output_tokens_reported(), None);
        assert!(!crate::window::is_bad_answer(&ev, 50), "not a short answer");
        // A reported 0 is an empty answer; below -1 is invalid.
        let mut empty = ev.clone();
        empty.output_tokens = 0;
        assert!(crate::window::is_bad_answer(&empty, 50));
        let mut wrong = sample_event();
        wrong.output_tokens = -2;
        let err = Decoder::new(WireFormat::Plain)
            .decode(&plain(&wrong), &SchemaCache::default())
            .unwrap_err();
        assert!(err.to_string().contains("output_tokens"), "{err}");
    }

    #[test]
    fn an_unsent_request_round_trips() {
        let mut ev = sample_event();
        ev.dispatch = Dispatch::Shed;
        let bytes = plain(&ev);
        let back = Decoder::new(WireFormat::Plain)
            .decode(&bytes, &NoRegistry)
            .unwrap();
        assert_eq!(back.dispatch, Dispatch::Shed);
        assert!(!back.was_sent());
    }

    /// A newer gateway: two extra fields (one in the middle, one a nested
    /// record) and an error class this build does not know.
    const NEWER_WRITER: &str = r#"{"type":"record","name":"RequestEvent","namespace":"hermes.v1","fields":[
        {"name":"event_id","type":"string"},
        {"name":"event_time_ms","type":{"type":"long","logicalType":"timestamp-millis"}},
        {"name":"region","type":"string","default":""},
        {"name":"gateway_id","type":"string"},
        {"name":"channel_id","type":"string"},
        {"name":"route_group","type":"string"},
        {"name":"model","type":"string"},
        {"name":"traffic_class","type":{"type":"enum","name":"TrafficClass","symbols":["INTERACTIVE","CORE","BATCH","EXPERIMENTAL"]}},
        {"name":"error_class","type":{"type":"enum","name":"ErrorClass","symbols":["NONE","UPSTREAM_OVERLOADED","SERVER_ERROR"]}},
        {"name":"latency_ms","type":"int"},
        {"name":"cache","type":{"type":"record","name":"Cache","fields":[{"name":"hit","type":"boolean"},{"name":"tokens","type":"long"}]}},
        {"name":"output_tokens","type":"int"}
    ]}"#;

    #[derive(serde::Serialize)]
    struct Cache {
        hit: bool,
        tokens: i64,
    }

    #[derive(serde::Serialize)]
    struct NewerEvent<'a> {
        event_id: &'a str,
        event_time_ms: i64,
        region: &'a str,
        gateway_id: &'a str,
        channel_id: &'a str,
        route_group: &'a str,
        model: &'a str,
        traffic_class: TrafficClass,
        error_class: &'a str,
        latency_ms: i32,
        cache: Cache,
        output_tokens: i32,
    }

    #[test]
    fn newer_writer_schema_skips_unknown_fields_and_symbols() {
        let schema: Schema = NEWER_WRITER.parse().unwrap();
        let new = NewerEvent {
            event_id: "ev-new",
            event_time_ms: 1_764_000_000_001,
            region: "eu-1",
            gateway_id: "gw-new",
            channel_id: "free-b",
            route_group: "chat",
            model: "m",
            traffic_class: TrafficClass::Experimental,
            error_class: "UPSTREAM_OVERLOADED",
            latency_ms: 77,
            cache: Cache {
                hit: true,
                tokens: 99,
            },
            output_tokens: 321,
        };
        let mut bytes = vec![0, 0, 0, 0, 9];
        bytes.extend(
            serde_avro_fast::to_datum_vec(
                &new,
                &mut serde_avro_fast::ser::SerializerConfig::new(&schema),
            )
            .unwrap(),
        );
        let mut registry = SchemaCache::default();
        registry.insert_json(9, NEWER_WRITER).unwrap();
        let ev = Decoder::new(WireFormat::Auto)
            .decode(&bytes, &registry)
            .unwrap();
        assert_eq!(ev.channel_id, "free-b");
        assert_eq!(ev.traffic_class, TrafficClass::Experimental);
        assert_eq!(ev.error_class, ErrorClass::Other);
        assert_eq!(ev.latency_ms, 77);
        assert_eq!(ev.output_tokens, 321, "field after the skipped record");
    }

    #[test]
    fn each_bad_input_has_its_own_error() {
        let dec = Decoder::new(WireFormat::Confluent);
        let mut registry = SchemaCache::default();
        registry.insert_json(1, REQUEST_EVENT_SCHEMA_JSON).unwrap();

        assert_eq!(dec.decode(&[], &registry), Err(CodecError::Empty));
        assert_eq!(
            dec.decode(&[0x7f, 0, 0, 0, 1, 2], &registry),
            Err(CodecError::WrongMagicByte { found: 0x7f })
        );
        assert_eq!(
            dec.decode(&[0, 0, 1], &registry),
            Err(CodecError::TruncatedHeader { len: 3 })
        );
        assert_eq!(
            dec.decode(&[0, 0, 0, 0, 42, 2, 65], &registry),
            Err(CodecError::UnknownSchemaId { schema_id: 42 })
        );

        let mut good = Vec::new();
        Encoder::default()
            .encode_confluent(&sample_event(), 1, &mut good)
            .unwrap();
        let truncated = &good[..good.len() - 6];
        assert!(matches!(
            dec.decode(truncated, &registry),
            Err(CodecError::TruncatedDatum { .. })
        ));

        // Garbage after a valid header: a negative string length.
        let garbage = [0, 0, 0, 0, 1, 0x01, 0xff, 0xff, 0xff];
        let err = dec.decode(&garbage, &registry).unwrap_err();
        assert!(
            matches!(
                err,
                CodecError::Malformed { .. } | CodecError::TruncatedDatum { .. }
            ),
            "{err:?}"
        );
        assert!(!err.to_string().is_empty());
    }

    #[test]
    fn invalid_values_are_rejected_with_the_field_name() {
        let mut ev = sample_event();
        ev.latency_ms = -5;
        let bytes = plain(&ev);
        let err = Decoder::new(WireFormat::Plain)
            .decode(&bytes, &NoRegistry)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid event: field `latency_ms` is negative"
        );
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut registry = SchemaCache::default();
        registry.insert_json(1, REQUEST_EVENT_SCHEMA_JSON).unwrap();
        let good = plain(&sample_event());
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for len in 0..400usize {
            let mut bytes = good.clone();
            for _ in 0..(1 + len % 7) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let i = (state as usize) % bytes.len();
                bytes[i] = (state >> 32) as u8;
            }
            bytes.truncate(len % (good.len() + 1));
            for format in [WireFormat::Auto, WireFormat::Plain, WireFormat::Confluent] {
                let _ = Decoder::new(format).decode(&bytes, &registry);
            }
        }
    }
}
