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
    #[cfg(target_arch = "x86_64")]
    each_line(start, bytes, |p| {
        // SAFETY: PREFETCHT0 never faults and writes nothing, whatever the
        // address. SSE, which it needs, is part of x86_64.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p) }
    });
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (start, bytes);
}

/// [`lines`] for memory wanted a while from now (tens of microseconds):
/// loaded into the core's second-level cache, not its first, where it
/// would push out what is being worked on. An evaluation tick reads some
/// 20–30 KB of one channel's windows; the next channel's are hinted this
/// way while the current one is measured.
#[inline(always)]
pub fn lines_later<T: ?Sized>(start: *const T, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    each_line(start, bytes, |p| {
        // SAFETY: as in `lines`; PREFETCHT1 differs only in the level.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p) }
    });
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (start, bytes);
}

/// Calls `hint` with an address in each cache line of the `bytes` bytes
/// from `start` (at least one).
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn each_line<T: ?Sized>(start: *const T, bytes: usize, hint: impl Fn(*const i8)) {
    let start = start.cast::<i8>();
    let mut offset = 0;
    while offset < bytes.max(1) {
        hint(start.wrapping_add(offset));
        offset += 64;
    }
}
