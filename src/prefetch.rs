//! Asking the CPU to start loading memory that is about to be read.
//!
//! At steady state the request path touches, per record, a slot of the
//! duplicate table (tens to hundreds of MB, one random slot per event id)
//! and the state of one channel among thousands (about 60 KB each): almost
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

/// Hints the cache lines of the `bytes` bytes from `start`. The address is
/// never read, so it may point anywhere (past a vector's length, say).
#[inline(always)]
pub fn lines<T: ?Sized>(start: *const T, bytes: usize) {
    let start = start.cast::<u8>();
    let mut offset = 0;
    while offset < bytes.max(1) {
        let p = start.wrapping_add(offset);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: PREFETCHT0 never faults and writes nothing, whatever the
        // address. SSE, which it needs, is part of x86_64.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = p;
        offset += 64;
    }
}
