//! An example gateway loop: reads a route group's weights from Redis with
//! `hermes::client::WeightClient`, routes simulated requests by them, and
//! reports the requests it does not send.
//!
//! ```sh
//! cargo run --example gateway -- redis://127.0.0.1:6379/ chat 10 [BROKERS [TOPIC]]
//! ```
//! Arguments: Redis URL, route group, seconds to run (default 10), and
//! optionally Kafka bootstrap servers and the request topic (default
//! `hermes.requests`). Each second it prints the snapshot version and age and
//! where 1 000 requests per class would go. A request the snapshot sheds (or
//! that has no channel) is not sent, but reported: an Avro request event with
//! `dispatch` = SHED or NO_CHANNEL, keyed by the channel the weights would
//! have picked (`RoutingTable::unsent_channel`), so Hermes measures demand
//! instead of inferring it from what was served. With brokers given those
//! events are produced; without, they are only counted. With Redis
//! unreachable it keeps routing by the last snapshot.
//!
//! A real gateway emits one event per attempt it makes as well; this example
//! makes no upstream calls, so it has none to report.

use hermes::client::{ClientOptions, WeightClient};
use hermes::codec::Encoder;
use hermes::event::{Dispatch, RequestEvent, TrafficClass, Unsent};
use hermes::routing::Pick;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::ClientConfig;
use std::collections::BTreeMap;
use std::time::Duration;

/// xorshift64*: the gateway's own cheap RNG for picks.
struct Rng(u64);
impl Rng {
    fn f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let url = args
        .get(1)
        .map_or("redis://127.0.0.1:6379/", |s| s.as_str());
    let group = args.get(2).map_or("chat", |s| s.as_str());
    let seconds: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(10);
    let producer: Option<FutureProducer> = match args.get(4) {
        Some(brokers) => Some(
            ClientConfig::new()
                .set("bootstrap.servers", brokers)
                .set("linger.ms", "20")
                .create()?,
        ),
        None => None,
    };
    let topic = args.get(5).map_or("hermes.requests", |s| s.as_str());
    let client =
        WeightClient::start(url, group, ClientOptions::default()).map_err(anyhow::Error::msg)?;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut encoder = Encoder::default();
    let mut buf = Vec::new();
    let (mut reported, mut seq) = (0u64, 0u64);
    for _ in 0..seconds {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let status = client.status();
        let Some(table) = client.table() else {
            println!("no snapshot yet ({} read errors)", status.read_errors);
            continue;
        };
        println!(
            "version {:?} epoch {:?}, snapshot age {:?} ms, last read {:?} ms ago",
            status.version, status.epoch, status.snapshot_age_ms, status.since_last_read_ms
        );
        for class in TrafficClass::ALL {
            let mut counts: BTreeMap<String, u32> = BTreeMap::new();
            for _ in 0..1000 {
                let (u1, u2) = (rng.f64(), rng.f64());
                let (key, how) = match table.pick(*class, rng.f64(), u1, u2) {
                    Pick::Channel(c) => (c.to_string(), None),
                    Pick::Shed => ("(shed)".to_string(), Some(Dispatch::Shed)),
                    Pick::NoRoute => ("(no route)".to_string(), Some(Dispatch::NoChannel)),
                };
                *counts.entry(key).or_insert(0) += 1;
                let (Some(how), Some(channel)) = (how, table.unsent_channel(*class, u1, u2)) else {
                    continue;
                };
                seq += 1;
                let id = format!("example-unsent-{seq}");
                buf.clear();
                let ev = RequestEvent::unsent(Unsent {
                    event_id: &id,
                    event_time_ms: hermes::wall_clock::now_ms(),
                    gateway_id: "example-gw",
                    channel_id: channel,
                    route_group: group,
                    traffic_class: *class,
                    attempt: 0,
                    dispatch: how,
                });
                encoder.encode_plain(&ev, &mut buf)?;
                reported += 1;
                if let Some(p) = &producer {
                    // Fire and forget: a lost demand report only blurs an
                    // estimate; the queue bounds what waits.
                    let _ = p.send_result(FutureRecord::to(topic).key(channel).payload(&buf));
                }
            }
            println!("  {:<12} {:?}", class.as_str(), counts);
        }
        println!(
            "  unsent requests reported so far: {reported}{}",
            if producer.is_some() {
                ""
            } else {
                " (not produced: no brokers given)"
            }
        );
    }
    if let Some(p) = producer {
        p.flush(Duration::from_secs(5))?;
    }
    Ok(())
}
