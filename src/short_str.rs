//! [`ShortStr`]: an immutable string kept inline when it is short.
//!
//! The request path compares every event's channel and route group ids with
//! the ones it knows, thousands of channels apart. A `String` keeps its
//! bytes in a heap block of its own, so each of those compares waited on one
//! more load from main memory (about 15 % of the request path at 10 000
//! channels). Ids are short ("openrouter-free-3"): kept inline, they sit in
//! the id table's slot (`id_table`) or the channel's entry that is read
//! anyway.

/// Bytes kept inline; longer strings go to the heap (still correct, one load
/// more). 22 keeps the whole value at 24 bytes, a `String`'s size.
const INLINE: usize = 22;

/// A string of up to `INLINE` bytes inline, else boxed; compared with a
/// `str` as the `str` it holds.
#[derive(Clone)]
pub enum ShortStr {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<str>),
}

impl ShortStr {
    pub fn new(s: &str) -> ShortStr {
        if s.len() <= INLINE {
            let mut bytes = [0u8; INLINE];
            bytes[..s.len()].copy_from_slice(s.as_bytes());
            ShortStr::Inline {
                len: s.len() as u8,
                bytes,
            }
        } else {
            ShortStr::Heap(s.into())
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            ShortStr::Inline { len, bytes } => {
                let b = &bytes[..*len as usize];
                debug_assert!(std::str::from_utf8(b).is_ok());
                // SAFETY: `new` copied these bytes whole from a `str`, and
                // `len` ends them where that `str` ended (a char boundary).
                unsafe { std::str::from_utf8_unchecked(b) }
            }
            ShortStr::Heap(s) => s,
        }
    }

    /// Hints the heap block of a long string (see [`crate::prefetch`]);
    /// a short one has none.
    #[inline(always)]
    pub fn prefetch_heap(&self) {
        if let ShortStr::Heap(s) = self {
            crate::prefetch::lines(s.as_ptr(), s.len());
        }
    }
}

impl PartialEq<str> for ShortStr {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl std::fmt::Debug for ShortStr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_and_compares_as_its_str() {
        for s in [
            "",
            "a",
            "openrouter-free-3",
            "exactly-twenty-two-by!",
            "twenty-three bytes long",
            "ünïcödé-ïds-ãrë-fïnë-tōō",
            "a much longer channel id than any inline buffer holds",
        ] {
            let k = ShortStr::new(s);
            assert_eq!(k.as_str(), s);
            assert!(k == *s);
            assert!(k != *format!("{s}x").as_str());
            assert_eq!(
                matches!(k, ShortStr::Inline { .. }),
                s.len() <= INLINE,
                "{s}"
            );
        }
        assert_eq!(std::mem::size_of::<ShortStr>(), 24);
    }
}
