//! What a slice counts of its attempts (real and probe apart), and which
//! successful answers are bad.

use crate::event::{ErrorClass, RequestEvent};

/// Counts for one population (real or probe) over one slice or a view.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counters {
    /// Attempts, excluding cancelled ones (they say nothing about the channel).
    pub requests: u32,
    /// Failed attempts other than client 4xx.
    pub errors: u32,
    /// Client 4xx (counted lightly).
    pub client_errors: u32,
    /// Connect errors, timeouts, resets, 5xx.
    pub hard_failures: u32,
    /// HTTP 429.
    pub rate_limited: u32,
    /// attempt > 0.
    pub retries: u32,
    /// Latency above `engine.slow_request_ms`.
    pub slow: u32,
    /// Successful attempts (the quality population).
    pub successes: u32,
    pub truncated: u32,
    /// Successes of structured requests, and those that failed their schema.
    pub structured: u32,
    pub schema_invalid: u32,
    /// Successes containing U+FFFD.
    pub garbled: u32,
    /// Successes with fewer than `engine.short_output_tokens` output tokens.
    pub short_outputs: u32,
    /// Successes whose answer is bad (docs/decisions.md#safety-rails: truncated, garbled,
    /// schema-invalid, or a real request's short/empty output): failures
    /// with HTTP 200. See [`is_bad_answer`].
    pub bad_answers: u32,
    /// Long-input attempts and their errors.
    pub long_requests: u32,
    pub long_errors: u32,
    /// Spend in the cost currency.
    pub cost: f64,
}

impl Counters {
    /// Counts one sent, not cancelled attempt (`long`: a long-input one).
    #[inline]
    pub(super) fn count(
        &mut self,
        ev: &RequestEvent<'_>,
        long: bool,
        slow_request_ms: i32,
        short_output_tokens: i32,
    ) {
        self.requests += 1;
        let failed = ev.error_class.is_error();
        match ev.error_class {
            ErrorClass::ClientError => self.client_errors += 1,
            e if e.is_error() => self.errors += 1,
            _ => {}
        }
        self.hard_failures += ev.error_class.is_hard_failure() as u32;
        self.rate_limited += (ev.error_class == ErrorClass::RateLimited) as u32;
        self.retries += (ev.attempt > 0) as u32;
        self.slow += (ev.latency_ms > slow_request_ms) as u32;
        if long {
            self.long_requests += 1;
            if failed && ev.error_class != ErrorClass::ClientError {
                self.long_errors += 1;
            }
        }
        self.cost += ev.cost;
        if !failed {
            self.successes += 1;
            self.truncated += ev.truncated as u32;
            if let Some(valid) = ev.schema_valid {
                self.structured += 1;
                self.schema_invalid += (!valid) as u32;
            }
            self.garbled += (ev.replacement_chars > 0) as u32;
            self.short_outputs += ev
                .output_tokens_reported()
                .is_some_and(|t| t < short_output_tokens) as u32;
            self.bad_answers += is_bad_answer(ev, short_output_tokens) as u32;
        }
    }

    pub(super) fn add(&mut self, o: &Counters) {
        self.requests += o.requests;
        self.errors += o.errors;
        self.client_errors += o.client_errors;
        self.hard_failures += o.hard_failures;
        self.rate_limited += o.rate_limited;
        self.retries += o.retries;
        self.slow += o.slow;
        self.successes += o.successes;
        self.truncated += o.truncated;
        self.structured += o.structured;
        self.schema_invalid += o.schema_invalid;
        self.garbled += o.garbled;
        self.short_outputs += o.short_outputs;
        self.bad_answers += o.bad_answers;
        self.long_requests += o.long_requests;
        self.long_errors += o.long_errors;
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
