//! Test fixtures: real servers on free loopback ports, stopped by PID.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free loopback port (bound and released; the server binds it next).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A redis-server of our own; SIGKILLed on drop.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        let mut s = RedisServer {
            port: free_port(),
            child: None,
        };
        s.restart();
        s
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Starts (again) on the same port, with no persistence.
    pub fn restart(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("redis-server could not start ({e}); `bash .ci/run` installs it")
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                use std::io::{Read, Write};
                let _ = c.set_read_timeout(Some(Duration::from_millis(500)));
                if c.write_all(b"PING\r\n").is_ok() {
                    let mut buf = [0u8; 7];
                    if c.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n" {
                        return;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `check` until it holds or `limit` passes (a bound on a wait, not a
/// performance target).
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check()
}
