//! The one framing of every bulk stream protocol (chunk stream, chunk fetch, trajectory pull):
//! a frame is an unsigned-varint (LEB128, at most 10 bytes) body length followed by exactly
//! that many body bytes. What a body contains is each protocol's business (they all use the
//! `storage::codec` encoding); the byte layouts are specified in `docs/protocol.md`.
//!
//! Owns: reading and writing frames, and the rule that a length is checked against the
//! caller's maximum *before* anything is allocated, so a peer cannot make a node allocate
//! more than the protocol allows. Must not touch: body encodings, protocol names, policy.
//!
//! Errors are `std::io::Error`s: `InvalidData` when the peer broke the framing (a length above
//! the maximum, a varint longer than 10 bytes or not minimally encoded), `UnexpectedEof` when
//! the stream ended inside a frame. No input makes these functions panic.

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use std::io;

/// Longest varint accepted for a frame length: 10 bytes hold any `u64`.
pub const MAX_LENGTH_BYTES: usize = 10;

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
) -> io::Result<Vec<u8>> {
    try_read_frame(r, max, what).await?.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("stream ended before a {what} frame"),
        )
    })
}

/// Like [`read_frame`], but a stream that ends cleanly before the first byte of the frame
/// yields `Ok(None)` (the peer is done); ending anywhere inside the frame is still an error.
pub async fn try_read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
    what: &str,
) -> io::Result<Option<Vec<u8>>> {
    let Some(len) = read_length(r, what).await? else {
        return Ok(None);
    };
    // Checked before allocating: `len` comes from the peer.
    if len > max as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{what} frame of {len} bytes exceeds the limit of {max}"),
        ));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("{what} frame truncated: {e}")))?;
    Ok(Some(body))
}

/// The varint length, read one byte at a time (never past the frame's length) and decoded by
/// `unsigned_varint`; `None` at a clean end of stream before the first byte.
async fn read_length<R: AsyncRead + Unpin>(r: &mut R, what: &str) -> io::Result<Option<u64>> {
    let mut buf = [0u8; MAX_LENGTH_BYTES];
    for i in 0..MAX_LENGTH_BYTES {
        let n = r.read(&mut buf[i..=i]).await?;
        if n == 0 {
            if i == 0 {
                return Ok(None);
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{what} frame length truncated after {i} bytes"),
            ));
        }
        if unsigned_varint::decode::is_last(buf[i]) {
            // `unsigned_varint` drops the bits of a 10th byte above the 64th silently.
            if i == MAX_LENGTH_BYTES - 1 && buf[i] > 1 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{what} frame length overflows u64"),
                ));
            }
            return unsigned_varint::decode::u64(&buf[..=i])
                .map(|(len, _)| Some(len))
                .map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{what} frame length: {e}"),
                    )
                });
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{what} frame length is longer than {MAX_LENGTH_BYTES} bytes"),
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
        assert!(err.to_string().contains("exceeds"), "{err}");
        let err = read_frame(&mut Cursor::new(framed(&[1, 2, 3]).await), 2, "t")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
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
