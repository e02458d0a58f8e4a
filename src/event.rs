//! The request event: one record per upstream attempt, as gateways emit it.
//!
//! `RequestEvent<'a>` borrows its strings from the Avro datum it was decoded
//! from, so decoding allocates nothing (see `codec`). The Rust field names are
//! the Avro field names of `schemas/request_event.avsc`, which is the contract.
//!
//! Schema evolution is handled by serde: a field an older writer lacks takes the
//! `#[serde(default)]` below, a field a newer writer adds is skipped, and an enum
//! symbol this build does not know maps to the enum's catch-all variant (the
//! Avro `default` symbol), never to an error.

use serde::{Deserialize, Serialize};

/// Declares a closed set of Avro enum symbols with a catch-all for symbols
/// added by newer writers. Serialized as the symbol string (which is what
/// serde_avro_fast expects for Avro enums); deserialized from it.
macro_rules! avro_enum {
    (
        $(#[$meta:meta])*
        $name:ident, fallback = $fallback:ident, { $($(#[$vmeta:meta])* $variant:ident => $symbol:literal),+ $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($(#[$vmeta])* $variant),+ }

        impl $name {
            /// Every variant, in schema order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The Avro symbol.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $symbol),+ }
            }

            /// Maps a symbol to its variant; unknown symbols map to the catch-all.
            pub fn from_symbol(symbol: &str) -> Self {
                match symbol { $($symbol => $name::$variant,)+ _ => $name::$fallback }
            }

            /// Position in `ALL`: a dense index for per-variant arrays.
            pub fn index(self) -> usize { self as usize }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl serde::de::Visitor<'_> for V {
                    type Value = $name;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str(concat!("a ", stringify!($name), " symbol"))
                    }
                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<$name, E> {
                        Ok($name::from_symbol(v))
                    }
                }
                d.deserialize_str(V)
            }
        }
    };
}

pub(crate) use avro_enum;

avro_enum! {
    /// What kind of caller traffic a request is; classes are scheduled in
    /// priority order (config `traffic_classes`).
    TrafficClass, fallback = Core, {
        Interactive => "INTERACTIVE",
        Core => "CORE",
        Batch => "BATCH",
        Experimental => "EXPERIMENTAL",
    }
}

avro_enum! {
    /// Why an attempt failed, as the gateway classified it.
    ErrorClass, fallback = Other, {
        None => "NONE",
        ConnectError => "CONNECT_ERROR",
        ConnectTimeout => "CONNECT_TIMEOUT",
        ReadTimeout => "READ_TIMEOUT",
        ConnectionReset => "CONNECTION_RESET",
        /// HTTP 429.
        RateLimited => "RATE_LIMITED",
        /// HTTP 5xx.
        ServerError => "SERVER_ERROR",
        /// Other HTTP 4xx: usually the caller's fault, so it counts lightly.
        ClientError => "CLIENT_ERROR",
        /// The caller gave up; says nothing about the channel.
        Cancelled => "CANCELLED",
        /// A class added by a newer gateway.
        Other => "OTHER",
    }
}

avro_enum! {
    /// Why generation stopped.
    FinishReason, fallback = Unknown, {
        Stop => "STOP",
        Length => "LENGTH",
        ContentFilter => "CONTENT_FILTER",
        ToolCalls => "TOOL_CALLS",
        Error => "ERROR",
        Unknown => "UNKNOWN",
    }
}

impl ErrorClass {
    /// A failure that says the channel itself is sick: it feeds the
    /// consecutive-failure fast path and the last-N outcome window. Client
    /// errors and cancellations are the caller's doing; rate limiting has its
    /// own signal (429s are the upstream protecting itself, not being down).
    pub fn is_hard_failure(self) -> bool {
        matches!(
            self,
            ErrorClass::ConnectError
                | ErrorClass::ConnectTimeout
                | ErrorClass::ReadTimeout
                | ErrorClass::ConnectionReset
                | ErrorClass::ServerError
                | ErrorClass::Other
        )
    }

    /// Any outcome other than success (for the error-rate signal).
    pub fn is_error(self) -> bool {
        !matches!(self, ErrorClass::None | ErrorClass::Cancelled)
    }
}

avro_enum! {
    /// Whether the gateway sent the request at all. Unsent requests are
    /// reported so that demand is measured, not inferred from what was
    /// served (a shed request would otherwise leave no trace).
    Dispatch, fallback = Sent, {
        /// An attempt made to `channel_id`.
        Sent => "SENT",
        /// Not sent: the snapshot's shed share for the class.
        Shed => "SHED",
        /// Not sent: no channel of the class had weight.
        NoChannel => "NO_CHANNEL",
    }
}

fn default_dispatch() -> Dispatch {
    Dispatch::Sent
}

/// `output_tokens` when the gateway did not report it: a producer whose
/// schema has no such field, or one that could not count (a stream cut
/// before any usage report). Unknown is not zero: a success with zero
/// tokens is an empty answer, one with an unknown count is not judged on
/// its length.
pub const OUTPUT_TOKENS_UNKNOWN: i32 = -1;

fn default_output_tokens() -> i32 {
    OUTPUT_TOKENS_UNKNOWN
}

fn default_finish_reason() -> FinishReason {
    FinishReason::Unknown
}

/// One upstream attempt. Field names and meanings: `schemas/request_event.avsc`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestEvent<'a> {
    pub event_id: &'a str,
    pub event_time_ms: i64,
    pub gateway_id: &'a str,
    pub channel_id: &'a str,
    pub route_group: &'a str,
    pub model: &'a str,
    pub traffic_class: TrafficClass,
    #[serde(default)]
    pub attempt: i32,
    #[serde(default)]
    pub http_status: i32,
    pub error_class: ErrorClass,
    pub latency_ms: i32,
    #[serde(default)]
    pub ttfb_ms: Option<i32>,
    #[serde(default)]
    pub input_tokens: i32,
    /// Tokens received; [`OUTPUT_TOKENS_UNKNOWN`] (-1, the default) when
    /// not reported.
    #[serde(default = "default_output_tokens")]
    pub output_tokens: i32,
    #[serde(default = "default_finish_reason")]
    pub finish_reason: FinishReason,
    #[serde(default)]
    pub truncated: bool,
    #[serde(default)]
    pub schema_valid: Option<bool>,
    #[serde(default)]
    pub replacement_chars: i32,
    #[serde(default)]
    pub is_probe: bool,
    #[serde(default)]
    pub cost: f64,
    #[serde(default)]
    pub quota_remaining: Option<i64>,
    #[serde(default, borrow)]
    pub trace_id: Option<&'a str>,
    /// `SENT` for an attempt; otherwise the request was not sent and the
    /// event counts as demand only (see the schema).
    #[serde(default = "default_dispatch")]
    pub dispatch: Dispatch,
}

impl RequestEvent<'_> {
    /// The output token count, when the gateway reported one.
    pub fn output_tokens_reported(&self) -> Option<i32> {
        (self.output_tokens >= 0).then_some(self.output_tokens)
    }

    /// The gateway sent this attempt (it is not a demand-only report).
    pub fn was_sent(&self) -> bool {
        self.dispatch == Dispatch::Sent
    }
}

/// Who reports a request that was not sent, and where it was meant to go.
#[derive(Debug, Clone, Copy)]
pub struct Unsent<'a> {
    pub event_id: &'a str,
    pub event_time_ms: i64,
    pub gateway_id: &'a str,
    /// The channel the weights would have picked (the schema's rule).
    pub channel_id: &'a str,
    pub route_group: &'a str,
    pub traffic_class: TrafficClass,
    pub attempt: i32,
    /// SHED or NO_CHANNEL.
    pub dispatch: Dispatch,
}

impl<'a> RequestEvent<'a> {
    /// The demand-only event a gateway emits for a request it did not send:
    /// no status, latency, tokens or cost (Hermes ignores them anyway).
    pub fn unsent(u: Unsent<'a>) -> RequestEvent<'a> {
        RequestEvent {
            event_id: u.event_id,
            event_time_ms: u.event_time_ms,
            gateway_id: u.gateway_id,
            channel_id: u.channel_id,
            route_group: u.route_group,
            model: "",
            traffic_class: u.traffic_class,
            attempt: u.attempt,
            http_status: 0,
            error_class: ErrorClass::None,
            latency_ms: 0,
            ttfb_ms: None,
            input_tokens: 0,
            output_tokens: 0,
            finish_reason: FinishReason::Unknown,
            truncated: false,
            schema_valid: None,
            replacement_chars: 0,
            is_probe: false,
            cost: 0.0,
            quota_remaining: None,
            trace_id: None,
            dispatch: u.dispatch,
        }
    }
}
