//! Asking the CPU to start loading memory that is about to be read.
//!
//! At steady state the request path touches, per record, a slot of the
//! duplicate table (tens to hundreds of MB, one random slot per event id)
//! and the state of one channel among thousands (about 40 KB each): almost
//! every record waits on main memory, one load after the other. A loop
//! that holds a batch of decoded records names the memory of a record a
//! few places ahead (`service::partition::Lookahead`), so those loads
//! overlap with the work on the records before it.
//!
//! A prefetch is only a hint: it changes nothing a program can observe but
//! its speed, so nothing here can change a decision.

/// Hints every cache line of `*r`.
#[inline(always)]
pub fn value<T: ?Sized>(r: &T) {
    lines(r as *const T, std::mem::size_of_val(r));
}

/// Hints the cache lines of the `bytes` bytes from `start` (at least
/// one): each line they touch, from the one `start` lies in to the one
/// their last byte does, so a span that does not start on a line
/// boundary has its last line hinted too. The address is never read, so it
/// may point anywhere (past a vector's length, say).
#[inline(always)]
pub fn lines<T: ?Sized>(start: *const T, bytes: usize) {
    let start = start.cast::<u8>();
    let (skip, count) = line_span(start as usize, bytes);
    let first = start.wrapping_sub(skip);
    for i in 0..count {
        let p = first.wrapping_add(i * LINE);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: PREFETCHT0 never faults and writes nothing, whatever the
        // address. SSE, which it needs, is part of x86_64.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = p;
    }
}

/// A cache line's bytes.
const LINE: usize = 64;

/// For `bytes` bytes (at least one) at address `start`: how far `start`
/// lies into its line, and how many lines they touch.
#[inline(always)]
fn line_span(start: usize, bytes: usize) -> (usize, usize) {
    let skip = start % LINE;
    (skip, (skip + bytes.max(1)).div_ceil(LINE))
}

#[cfg(test)]
mod tests {
    use super::line_span;

    #[test]
    fn every_line_a_span_touches_is_hinted() {
        // (start, bytes) -> lines
        for (start, bytes, lines) in [
            (0, 0, 1),
            (0, 1, 1),
            (0, 64, 1),
            (0, 65, 2),
            (63, 1, 1),
            (63, 2, 2),
            // A slice's real counts in an odd slot (168-byte slots).
            (64 * 10 + 40, 112, 3),
            (64 * 10 + 16, 112, 2),
            (128, 300, 5),
            (100, 300, 6),
        ] {
            assert_eq!(line_span(start, bytes).1, lines, "{bytes} bytes at {start}");
            assert_eq!(line_span(start, bytes).0, start % 64);
        }
    }
}
