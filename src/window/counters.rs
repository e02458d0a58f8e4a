//! What a slice counts of its attempts (real and probe apart), and which
//! successful answers are bad.

use crate::event::{ErrorClass, RequestEvent};

/// Counts for one population (real or probe) over one slice or a view.
pub type Counters = CountersOf<u32>;

/// [`Counters`] kept in integers of type `N`: a view's and a slice's real
/// counts in `u32`, a slice's probe counts in `u16` ([`ProbeCounters`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CountersOf<N> {
    /// Attempts, excluding cancelled ones (they say nothing about the channel).
    pub requests: N,
    /// Failed attempts other than client 4xx.
    pub errors: N,
    /// Client 4xx (counted lightly).
    pub client_errors: N,
    /// Connect errors, timeouts, resets, 5xx.
    pub hard_failures: N,
    /// HTTP 429.
    pub rate_limited: N,
    /// attempt > 0.
    pub retries: N,
    /// Latency above `engine.slow_request_ms`.
    pub slow: N,
    /// Successful attempts (the quality population).
    pub successes: N,
    pub truncated: N,
    /// Successes of structured requests, and those that failed their schema.
    pub structured: N,
    pub schema_invalid: N,
    /// Successes containing U+FFFD.
    pub garbled: N,
    /// Successes with fewer than `engine.short_output_tokens` output tokens.
    pub short_outputs: N,
    /// Successes whose answer is bad (docs/decisions.md#safety-rails: truncated, garbled,
    /// schema-invalid, or a real request's short/empty output): failures
    /// with HTTP 200. See [`is_bad_answer`].
    pub bad_answers: N,
    /// Long-input attempts and their errors.
    pub long_requests: N,
    pub long_errors: N,
    /// Spend in the cost currency.
    pub cost: f64,
}

/// A slice's probe counts: 40 bytes where [`Counters`] takes 72. Probes are
/// the few requests a drained channel is tested with, so a count saturates
/// at 65 535 a slice (13 107 probes a second for a 5-second slice) and a
/// view widens them as it sums them (`Counters::add`).
pub(super) type ProbeCounters = CountersOf<u16>;

/// An integer a count is kept in.
pub trait Count: Copy + Default + Into<u32> {
    /// Adds one if `yes`.
    fn bump(&mut self, yes: bool);
}

impl Count for u32 {
    #[inline]
    fn bump(&mut self, yes: bool) {
        *self += yes as u32;
    }
}

impl Count for u16 {
    /// Saturating: a probe count stops at `u16::MAX` a slice.
    #[inline]
    fn bump(&mut self, yes: bool) {
        *self = self.saturating_add(yes as u16);
    }
}

impl<N: Count> CountersOf<N> {
    /// Counts one sent, not cancelled attempt (`long`: a long-input one).
    #[inline]
    pub(super) fn count(
        &mut self,
        ev: &RequestEvent<'_>,
        long: bool,
        slow_request_ms: i32,
        short_output_tokens: i32,
    ) {
        self.requests.bump(true);
        let failed = ev.error_class.is_error();
        match ev.error_class {
            ErrorClass::ClientError => self.client_errors.bump(true),
            e if e.is_error() => self.errors.bump(true),
            _ => {}
        }
        self.hard_failures.bump(ev.error_class.is_hard_failure());
        self.rate_limited
            .bump(ev.error_class == ErrorClass::RateLimited);
        self.retries.bump(ev.attempt > 0);
        self.slow.bump(ev.latency_ms > slow_request_ms);
        if long {
            self.long_requests.bump(true);
            self.long_errors
                .bump(failed && ev.error_class != ErrorClass::ClientError);
        }
        self.cost += ev.cost;
        if !failed {
            self.successes.bump(true);
            self.truncated.bump(ev.truncated);
            if let Some(valid) = ev.schema_valid {
                self.structured.bump(true);
                self.schema_invalid.bump(!valid);
            }
            self.garbled.bump(ev.replacement_chars > 0);
            self.short_outputs.bump(
                ev.output_tokens_reported()
                    .is_some_and(|t| t < short_output_tokens),
            );
            self.bad_answers
                .bump(is_bad_answer(ev, short_output_tokens));
        }
    }
}

impl Counters {
    /// Adds a slice's counts (either width) to a view's.
    pub(super) fn add<N: Count>(&mut self, o: &CountersOf<N>) {
        self.requests += o.requests.into();
        self.errors += o.errors.into();
        self.client_errors += o.client_errors.into();
        self.hard_failures += o.hard_failures.into();
        self.rate_limited += o.rate_limited.into();
        self.retries += o.retries.into();
        self.slow += o.slow.into();
        self.successes += o.successes.into();
        self.truncated += o.truncated.into();
        self.structured += o.structured.into();
        self.schema_invalid += o.schema_invalid.into();
        self.garbled += o.garbled.into();
        self.short_outputs += o.short_outputs.into();
        self.bad_answers += o.bad_answers.into();
        self.long_requests += o.long_requests.into();
        self.long_errors += o.long_errors.into();
        self.cost += o.cost;
    }
}

/// Summed counters of a view.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ViewCounters {
    pub real: Counters,
    pub probe: Counters,
    pub class_requests: [u32; 4],
    pub class_tokens: [u64; 4],
    /// Unsent requests per class (shed, or no channel): demand only.
    pub class_unsent: [u32; 4],
}

/// A successful attempt whose answer is no good to the caller (docs/decisions.md#safety-rails: "a
/// bad answer is a failed request"): truncated, garbled (U+FFFD), failing its
/// schema, or, for real traffic, shorter than `short_output_tokens` (an empty
/// or cut answer; probes ask fixed short questions, so their length says
/// nothing). Errors are failures already and are not bad *answers*.
pub fn is_bad_answer(ev: &RequestEvent<'_>, short_output_tokens: i32) -> bool {
    ev.error_class == ErrorClass::None
        && (ev.truncated
            || ev.replacement_chars > 0
            || ev.schema_valid == Some(false)
            || !ev.is_probe
                && ev
                    .output_tokens_reported()
                    .is_some_and(|t| t < short_output_tokens))
}
