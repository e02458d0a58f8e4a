//! The instance's request loops stopping together: each commits what it
//! handled before any of them leaves the consumer group (`Leaving`, shared
//! by the loops, and `leave`, a function of one loop's state).

use super::{housekeeping, LoopState, RequestConsumer};
use crate::service::{lock, rebalance};
use rdkafka::consumer::CommitMode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// An instance's request loops stopping together. Each commits what it
/// handled, then waits (at most `BROKER_TIMEOUT`) until every loop has
/// committed before it leaves the consumer group: the first to leave
/// starts a rebalance, and the broker refuses a commit made during one
/// ("rebalance in progress"), so whoever takes the partitions over would
/// handle the events since that loop's last periodic commit again.
#[derive(Debug, Default)]
pub struct Leaving {
    /// Loops done committing (or stopped by a failure).
    done: Mutex<usize>,
    all_done: std::sync::Condvar,
}

impl Leaving {
    /// Loop done: wait for the other `lanes - 1` to be, for at most `wait`.
    /// Whether they all were.
    pub(super) fn done_then_wait(&self, lanes: usize, wait: Duration) -> bool {
        let mut done = lock(&self.done);
        *done += 1;
        self.all_done.notify_all();
        let deadline = Instant::now() + wait;
        while *done < lanes {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            done = self
                .all_done
                .wait_timeout(done, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// A loop that failed: counted as done, without waiting (the service
    /// stops the others when it hears of the failure, after this returns).
    pub(super) fn failed(&self) {
        *lock(&self.done) += 1;
        self.all_done.notify_all();
    }
}

/// The way out: every output acknowledged and the offsets committed
/// (synchronously: the consumer closes next), then the group left only
/// once the instance's other loops have committed too (see [`Leaving`]).
pub(super) fn leave(lp: &mut LoopState, consumer: &RequestConsumer) -> anyhow::Result<()> {
    if let Err(e) = housekeeping::commit_with(lp, consumer, CommitMode::Sync) {
        lp.leaving.failed();
        return Err(e);
    }
    if !lp
        .leaving
        .done_then_wait(lp.lanes, rebalance::BROKER_TIMEOUT)
    {
        tracing::warn!(
            lanes = lp.lanes,
            "the other request loops did not commit in time; leaving the group anyway"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn each_loop_waits_until_every_loop_committed() {
        let leaving = Arc::new(Leaving::default());
        let others: Vec<_> = (0..2)
            .map(|i| {
                let l = leaving.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(50 * i));
                    l.done_then_wait(3, Duration::from_secs(10))
                })
            })
            .collect();
        let started = Instant::now();
        std::thread::sleep(Duration::from_millis(100));
        assert!(leaving.done_then_wait(3, Duration::from_secs(10)));
        for o in others {
            assert!(o.join().unwrap(), "released once all three were done");
        }
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_failed_loop_counts_and_a_missing_one_is_waited_for_at_most_the_bound() {
        let leaving = Leaving::default();
        leaving.failed();
        assert!(leaving.done_then_wait(2, Duration::from_secs(10)));
        let alone = Leaving::default();
        let started = Instant::now();
        assert!(!alone.done_then_wait(2, Duration::from_millis(100)));
        assert!(started.elapsed() >= Duration::from_millis(100));
    }
}
