//! `hermes run` end to end: a real Kafka-protocol broker (tansu, SQLite
//! storage), a real redis-server, Hermes as separate processes, and a
//! synthetic gateway producing Avro request events. One file per concern;
//! `fixtures` holds what they share, `support` (with the other test
//! binaries) the servers and the `Stack` that starts and stops them.

#[path = "../support/mod.rs"]
mod support;

mod dependencies;
mod fixtures;
mod incident_edges;
mod instances;
mod operator;
mod pipeline;
