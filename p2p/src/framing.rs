//! The one framing of every bulk stream protocol (chunk stream, chunk fetch, trajectory pull):
//! a frame is an unsigned-varint (LEB128, at most 10 bytes) body length followed by exactly
//! that many body bytes. What a body contains is each protocol's business (they all use the
//! `storage::codec` encoding); the byte layouts are specified in `docs/protocol.md`.
//!
//! Owns: reading and writing frames, the deadline a frame of a given size gets
//! ([`frame_deadline`]), and the rule that a length is checked against the
//! caller's maximum *before* anything is allocated, so a peer cannot make a node allocate
//! more than the protocol allows. Must not touch: body encodings, protocol names, policy.
//!
//! Reads fail with a typed [`FrameError`]: [`FrameError::TooLarge`] when the length is above
//! the caller's maximum (the peer sent more than the protocol allows), [`FrameError::Malformed`]
//! when the length is not a valid varint (longer than 10 bytes, not minimally encoded,
//! overflowing), [`FrameError::Io`] when the stream failed or ended inside a frame
//! (`UnexpectedEof`). Callers decide on the variant, never on the message. No input makes
//! these functions panic.

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use std::io;

/// Longest varint accepted for a frame length: 10 bytes hold any `u64`.
pub const MAX_LENGTH_BYTES: usize = 10;

/// Slowest transfer rate a frame deadline allows for: a frame of `n` bytes may take the
/// protocol's base deadline plus `n / MIN_RATE_BYTES_PER_S` seconds (a large frame on a slow
/// link is not a stalled peer). Shared by every bulk stream protocol.
pub const MIN_RATE_BYTES_PER_S: u64 = 1 << 20;

/// The deadline for moving one frame of up to `max` bytes: `base`, plus the time `max` bytes
/// take at [`MIN_RATE_BYTES_PER_S`].
pub fn frame_deadline(base: std::time::Duration, max: u64) -> std::time::Duration {
    base + std::time::Duration::from_secs(max / MIN_RATE_BYTES_PER_S)
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The frame's length is above the caller's maximum: nothing was allocated.
    #[error("{what} frame of {len} bytes exceeds the limit of {max}")]
    TooLarge { what: String, len: u64, max: usize },
    /// The length is not a valid varint: the peer broke the framing.
    #[error("{what} frame length: {reason}")]
    Malformed { what: String, reason: String },
    /// The stream failed, or ended inside a frame (`UnexpectedEof`).
    #[error("{what} frame: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

impl FrameError {
    /// `InvalidData` when the peer broke the framing ([`FrameError::TooLarge`],
    /// [`FrameError::Malformed`]), the I/O error's own kind otherwise.
    pub fn kind(&self) -> io::ErrorKind {
        match self {
            FrameError::TooLarge { .. } | FrameError::Malformed { .. } => {
                io::ErrorKind::InvalidData
            }
            FrameError::Io { source, .. } => source.kind(),
        }
    }

    /// Whether the peer broke the framing (rather than the stream failing).
    pub fn is_violation(&self) -> bool {
        !matches!(self, FrameError::Io { .. })
    }

    fn io(what: &str, source: io::Error) -> Self {
        FrameError::Io {
            what: what.to_string(),
            source,
        }
    }

    fn malformed(what: &str, reason: impl Into<String>) -> Self {
        FrameError::Malformed {
            what: what.to_string(),
            reason: reason.into(),
        }
    }
}

/// For callers that fold a framing failure into their I/O errors: the kind is kept
/// ([`FrameError::kind`]), the typed error is the source.
impl From<FrameError> for io::Error {
    fn from(e: FrameError) -> Self {
        match e {
            FrameError::Io { source, .. } => source,
            e => io::Error::new(e.kind(), e),
        }
    }
}

/// Writes `body` as one frame (length, then body). Does not flush.
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, body: &[u8]) -> io::Result<()> {
    let mut buf = unsigned_varint::encode::u64_buffer();
    let len = unsigned_varint::encode::u64(body.len() as u64, &mut buf);
    w.write_all(len).await?;
    w.write_all(body).await
}

/// Reads one frame of at most `max` body bytes; `what` names it in errors. A stream that ends
/// before the frame is complete (even before its first byte) is an `UnexpectedEof` error.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
    what: &str,
) -> Result<Vec<u8>, FrameError> {
    try_read_frame(r, max, what).await?.ok_or_else(|| {
        FrameError::io(
            what,
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "stream ended before the frame",
            ),
        )
    })
}

/// Like [`read_frame`], but a stream that ends cleanly before the first byte of the frame
/// yields `Ok(None)` (the peer is done); ending anywhere inside the frame is still an error.
pub async fn try_read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
    what: &str,
) -> Result<Option<Vec<u8>>, FrameError> {
    let Some(len) = read_length(r, what).await? else {
        return Ok(None);
    };
    // Checked before allocating: `len` comes from the peer.
    if len > max as u64 {
        return Err(FrameError::TooLarge {
            what: what.to_string(),
            len,
            max,
        });
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)
        .await
        .map_err(|e| FrameError::io(what, io::Error::new(e.kind(), format!("truncated: {e}"))))?;
    Ok(Some(body))
}

/// The varint length, read one byte at a time (never past the frame's length) and decoded by
/// `unsigned_varint`; `None` at a clean end of stream before the first byte.
async fn read_length<R: AsyncRead + Unpin>(
    r: &mut R,
    what: &str,
) -> Result<Option<u64>, FrameError> {
    let mut buf = [0u8; MAX_LENGTH_BYTES];
    for i in 0..MAX_LENGTH_BYTES {
        let n = r
            .read(&mut buf[i..=i])
            .await
            .map_err(|e| FrameError::io(what, e))?;
        if n == 0 {
            if i == 0 {
                return Ok(None);
            }
            return Err(FrameError::io(
                what,
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("length truncated after {i} bytes"),
                ),
            ));
        }
        if unsigned_varint::decode::is_last(buf[i]) {
            // `unsigned_varint` drops the bits of a 10th byte above the 64th silently.
            if i == MAX_LENGTH_BYTES - 1 && buf[i] > 1 {
                return Err(FrameError::malformed(what, "overflows u64"));
            }
            return unsigned_varint::decode::u64(&buf[..=i])
                .map(|(len, _)| Some(len))
                .map_err(|e| FrameError::malformed(what, e.to_string()));
        }
    }
    Err(FrameError::malformed(
        what,
        format!("longer than {MAX_LENGTH_BYTES} bytes"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::io::Cursor;

    async fn framed(body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame(&mut out, body).await.unwrap();
        out
    }

    #[tokio::test]
    async fn frames_round_trip() {
        for n in [0usize, 1, 127, 128, 300, 70_000] {
            let body: Vec<u8> = (0..n).map(|i| i as u8).collect();
            let mut bytes = framed(&body).await;
            // Two frames back to back: the reader stops exactly at the frame's end.
            bytes.extend_from_slice(&framed(b"next").await);
            let mut r = Cursor::new(bytes);
            assert_eq!(read_frame(&mut r, n, "t").await.unwrap(), body);
            assert_eq!(read_frame(&mut r, 4, "t").await.unwrap(), b"next");
            assert!(try_read_frame(&mut r, 4, "t").await.unwrap().is_none());
        }
        // 128 needs two length bytes: 0x80 0x01.
        assert_eq!(&framed(&[0; 128]).await[..2], &[0x80, 0x01]);
    }

    #[tokio::test]
    async fn a_length_over_the_limit_is_refused_before_allocating() {
        // Claims u64::MAX / 2 bytes and carries none: allocating first would abort.
        let mut bytes = Vec::new();
        let mut buf = unsigned_varint::encode::u64_buffer();
        bytes.extend_from_slice(unsigned_varint::encode::u64(u64::MAX / 2, &mut buf));
        let err = read_frame(&mut Cursor::new(bytes), 1 << 20, "chunk")
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(
            matches!(err, FrameError::TooLarge { len, max, .. } if len == u64::MAX / 2 && max == 1 << 20),
            "{err}"
        );
        let err = read_frame(&mut Cursor::new(framed(&[1, 2, 3]).await), 2, "t")
            .await
            .unwrap_err();
        assert!(
            matches!(err, FrameError::TooLarge { len: 3, max: 2, .. }),
            "{err}"
        );
    }

    #[tokio::test]
    async fn truncated_lengths_and_bodies_are_errors() {
        // The stream ends inside the varint.
        let err = read_frame(&mut Cursor::new(vec![0x80]), 100, "t")
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        let err = try_read_frame(&mut Cursor::new(vec![0x80]), 100, "t")
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        // The stream ends inside the body.
        let mut bytes = framed(&[9; 10]).await;
        bytes.truncate(5);
        let err = read_frame(&mut Cursor::new(bytes), 100, "t")
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        // Nothing at all: an error for `read_frame`, a clean end for `try_read_frame`.
        let err = read_frame(&mut Cursor::new(vec![]), 100, "t")
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(try_read_frame(&mut Cursor::new(vec![]), 100, "t")
            .await
            .unwrap()
            .is_none());
    }

    #[tokio::test]
    async fn overlong_and_non_minimal_varints_are_errors() {
        // 11 continuation bytes: refused after the 10th, without reading further.
        let err = read_frame(&mut Cursor::new(vec![0xff; 11]), 100, "t")
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        // 10 bytes whose value overflows u64.
        let mut bytes = vec![0xff; 9];
        bytes.push(0x02);
        let err = read_frame(&mut Cursor::new(bytes), 100, "t")
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        // 1 encoded in two bytes.
        let err = read_frame(&mut Cursor::new(vec![0x81, 0x00, 0]), 100, "t")
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[tokio::test]
    async fn random_bytes_never_panic() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let n = (x % 24) as usize;
            let bytes: Vec<u8> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = read_frame(&mut Cursor::new(bytes), 64, "t").await;
        }
    }
}
