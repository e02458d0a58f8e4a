//! Operator pins: set, cleared, expired.

use super::{Change, Pin, StateMachine, TransitionReason};
use crate::config::StatePolicy;

impl StateMachine {
    /// Applies an operator pin. Recorded as a change (and so an alert).
    pub fn set_pin(&mut self, now_ms: i64, pin: Pin, p: &StatePolicy, out: &mut Vec<Change>) {
        self.repin(now_ms, Some(pin), TransitionReason::PinApplied, p, out);
    }

    /// Removes the pin, if any.
    pub fn clear_pin(&mut self, now_ms: i64, p: &StatePolicy, out: &mut Vec<Change>) {
        if self.pin.is_some() {
            self.repin(now_ms, None, TransitionReason::PinReleased, p, out);
        }
    }

    /// Sets or clears the pin; the state stays, the weight may move.
    fn repin(
        &mut self,
        now_ms: i64,
        pin: Option<Pin>,
        reason: TransitionReason,
        p: &StatePolicy,
        out: &mut Vec<Change>,
    ) {
        let before = self.weight(p);
        self.pin = pin;
        let k = self.kind();
        out.push(Change {
            at_ms: now_ms,
            from: k,
            to: k,
            reason,
            weight_before: before,
            weight_after: self.weight(p),
        });
    }

    pub(super) fn expire_pin(&mut self, now_ms: i64, p: &StatePolicy, out: &mut Vec<Change>) {
        if self
            .pin
            .and_then(|pin| pin.until_ms)
            .is_some_and(|until| now_ms >= until)
        {
            self.clear_pin(now_ms, p, out);
        }
    }
}
