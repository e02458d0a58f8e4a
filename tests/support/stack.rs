//! One test's world: a Kafka-protocol broker, a Redis, a scratch directory
//! and the Hermes instances started in it. Tests of one binary that start
//! servers take turns (`Scratch` holds the binary's lock): tansu and Hermes
//! are heavy, and the timing-sensitive tests must not share two cores with
//! another test's stack.

use super::{free_port, Hermes, RedisServer, Tansu};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

static SERIAL: Mutex<()> = Mutex::new(());

/// The binary's turn and a scratch directory, removed on drop when the
/// test passed (kept, and named on stderr, when it failed: the Hermes logs
/// are in it).
pub struct Scratch {
    dir: PathBuf,
    _turn: MutexGuard<'static, ()>,
}

impl Scratch {
    /// Waits for the binary's turn (a test that failed holding it does not
    /// block the others), then makes a fresh directory named for `what`.
    pub fn new(what: &str) -> Scratch {
        let turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir =
            std::env::temp_dir().join(format!("hermes-{what}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        Scratch { dir, _turn: turn }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept for a look: {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// tansu with `topics` and a Redis, in a [`Scratch`]; every server is
/// stopped by its PID when the stack drops (the instances a test started
/// drop before it: they were made after it).
pub struct Stack {
    pub kafka: Tansu,
    pub redis: RedisServer,
    // Last: the directory goes and the turn passes once the servers are down.
    pub scratch: Scratch,
}

impl Stack {
    /// A broker with `topics` and a Redis without persistence (a restart
    /// comes back empty).
    pub fn start(topics: &[(&str, u32)]) -> Stack {
        Stack::start_with(topics, RedisServer::start)
    }

    /// As [`Stack::start`], with the Redis `redis` starts (persistent, TLS).
    pub fn start_with(topics: &[(&str, u32)], redis: impl FnOnce() -> RedisServer) -> Stack {
        let scratch = Scratch::new("stack");
        let kafka = Tansu::start(topics);
        let redis = redis();
        Stack {
            kafka,
            redis,
            scratch,
        }
    }

    pub fn dir(&self) -> &Path {
        self.scratch.dir()
    }

    /// `hermes run` named `name` on a free HTTP port, its config written
    /// by `config` from this stack's broker list, Redis URL and that port.
    pub fn hermes(&self, name: &str, config: impl FnOnce(&str, &str, u16) -> String) -> Hermes {
        let port = free_port();
        let cfg = config(&self.kafka.bootstrap(), &self.redis.url(), port);
        Hermes::start(self.dir(), name, &cfg, port)
    }
}
