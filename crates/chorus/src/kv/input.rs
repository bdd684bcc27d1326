//! The cursor the record decoders read with.

use std::ops::{Deref, DerefMut};

use bytes::{Buf, Bytes};

use super::command::CommandError;

/// A decoder's cursor into one record. The bytes a decoded command keeps
/// (keys, values) are slices of the record's own buffer when the decoder was
/// given it and they make up at least half of it, so applying a put copies
/// no value; smaller ones (keys, one value of a batch, a transaction's
/// compared values) are copied, so that what a state keeps of a record never
/// keeps more than twice its own bytes alive. Read from a borrowed slice,
/// they are copied.
///
/// It dereferences to the remaining bytes (`&mut &[u8]`), so the decoders of
/// fixed-size fields read it as they read any slice.
pub(super) struct Input<'a> {
    rest: &'a [u8],
    buffer: Option<&'a Bytes>,
}

impl<'a> Input<'a> {
    /// A cursor over `rest`, a part of `buffer` (or of a borrowed slice,
    /// with `None`), whose kept bytes are slices of `buffer`.
    ///
    /// # Panics
    /// If `rest` does not lie within `buffer`.
    pub(super) fn new(rest: &'a [u8], buffer: Option<&'a Bytes>) -> Input<'a> {
        if let Some(buffer) = buffer {
            let (start, end) = (buffer.as_ptr() as usize, rest.as_ptr() as usize);
            assert!(
                end >= start && end + rest.len() <= start + buffer.len(),
                "the input lies within its buffer"
            );
        }
        Input { rest, buffer }
    }

    /// A length-prefixed byte string (`u32 LE` length, then the bytes).
    pub(super) fn take_bytes(&mut self) -> Result<Bytes, CommandError> {
        let truncated = || CommandError::Malformed {
            reason: "truncated".into(),
        };
        if self.rest.len() < 4 {
            return Err(truncated());
        }
        let length = self.rest.get_u32_le() as usize;
        if self.rest.len() < length {
            return Err(truncated());
        }
        let (taken, rest) = self.rest.split_at(length);
        self.rest = rest;
        Ok(match self.buffer {
            Some(buffer) if taken.len() * 2 >= buffer.len() => buffer.slice_ref(taken),
            _ => Bytes::copy_from_slice(taken),
        })
    }
}

impl<'a> Deref for Input<'a> {
    type Target = &'a [u8];

    fn deref(&self) -> &&'a [u8] {
        &self.rest
    }
}

impl DerefMut for Input<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.rest
    }
}

#[cfg(test)]
mod tests {
    use bytes::BufMut;

    use super::*;

    fn strings(parts: &[&[u8]]) -> Bytes {
        let mut out = Vec::new();
        for part in parts {
            out.put_u32_le(part.len() as u32);
            out.put_slice(part);
        }
        out.put_u8(7);
        Bytes::from(out)
    }

    #[test]
    fn most_of_the_buffer_is_shared_and_the_rest_copied() {
        let value = vec![b'v'; 64];
        let record = strings(&[b"key", b"", &value]);
        let mut shared = Input::new(&record[..], Some(&record));
        let mut borrowed = Input::new(&record[..], None);
        let within = record.as_ptr_range();
        for (expected, is_shared) in [(&b"key"[..], false), (b"", false), (&value, true)] {
            let (from_buffer, copied) =
                (shared.take_bytes().unwrap(), borrowed.take_bytes().unwrap());
            assert_eq!((&from_buffer[..], &copied[..]), (expected, expected));
            if !expected.is_empty() {
                assert_eq!(
                    within.contains(&from_buffer.as_ptr()),
                    is_shared,
                    "{expected:?}"
                );
                assert!(!within.contains(&copied.as_ptr()), "a copy");
            }
        }
        // The rest reads as a slice.
        assert_eq!(shared.get_u8(), 7);
        assert!(shared.is_empty());
    }

    #[test]
    fn a_short_string_is_refused() {
        let record = strings(&[b"key"]);
        for cut in [0, 2, 4, 6] {
            let error = Input::new(&record[..cut], Some(&record))
                .take_bytes()
                .unwrap_err();
            assert_eq!(
                error.to_string(),
                CommandError::Malformed {
                    reason: "truncated".into()
                }
                .to_string()
            );
        }
    }

    #[test]
    #[should_panic(expected = "within its buffer")]
    fn input_from_another_buffer_is_a_bug() {
        let (record, other) = (strings(&[b"a"]), strings(&[b"b"]));
        let _ = Input::new(&other[..], Some(&record));
    }
}
