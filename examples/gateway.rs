//! An example gateway loop: reads a route group's weights from Redis with
//! `hermes::client::WeightClient` and routes simulated requests by them.
//!
//! ```sh
//! cargo run --example gateway -- redis://127.0.0.1:6379/ chat 10
//! ```
//! Arguments: Redis URL, route group, seconds to run (default 10). Each second
//! it prints the snapshot version and age and where 1 000 requests per class
//! would go. With Redis unreachable it keeps routing by the last snapshot.

use hermes::client::{ClientOptions, Pick, WeightClient};
use hermes::event::TrafficClass;
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
    let client =
        WeightClient::start(url, group, ClientOptions::default()).map_err(anyhow::Error::msg)?;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
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
                let key = match table.pick(*class, rng.f64(), rng.f64(), rng.f64()) {
                    Pick::Channel(c) => c.to_string(),
                    Pick::Shed => "(shed)".to_string(),
                    Pick::NoRoute => "(no route)".to_string(),
                };
                *counts.entry(key).or_insert(0) += 1;
            }
            println!("  {:<12} {:?}", class.as_str(), counts);
        }
    }
    Ok(())
}
