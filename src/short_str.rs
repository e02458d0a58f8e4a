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
    /// An inline string is compared as its whole zero-padded buffer, a
    /// fixed-size compare of the bytes it sits in. `<[u8]>::eq` of the
    /// `len` bytes calls `memcmp`, whose wide masked load reads past
    /// them: for an id in the second half of a cache line (every other
    /// `id_table` slot) that is the next line, which no hint loaded, and
    /// the request path waited on it at every such lookup.
    #[inline]
    fn eq(&self, other: &str) -> bool {
        match self {
            ShortStr::Inline { len, bytes } => {
                let other = other.as_bytes();
                if other.len() != *len as usize {
                    return false;
                }
                let mut padded = [0u8; INLINE];
                padded[..other.len()].copy_from_slice(other);
                *bytes == padded
            }
            ShortStr::Heap(s) => **s == *other,
        }
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

    #[test]
    fn padding_never_makes_two_strings_equal() {
        // The inline compare reads the zero padding: a NUL at the end, a
        // last byte that differs, a prefix, must still tell them apart.
        let pairs = [
            ("ab", "ab\0"),
            ("ab\0", "ab"),
            ("ab\0", "ab\0\0"),
            ("", "\0"),
            ("channel-0001", "channel-0002"),
            ("channel-0001", "channel-000"),
            ("exactly-twenty-two-by!", "exactly-twenty-two-by?"),
            ("exactly-twenty-two-by!", "exactly-twenty-two-by!!"),
        ];
        for (held, asked) in pairs {
            assert!(ShortStr::new(held) != *asked, "{held:?} {asked:?}");
            assert!(ShortStr::new(held) == *held, "{held:?}");
        }
    }
}
