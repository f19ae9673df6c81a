//! Wire formats of the two bulk protocols over `libp2p-stream` (see `docs/protocol.md`,
//! "Snapshot dissemination"). All integers are big-endian; every length is checked against an
//! explicit limit before anything is allocated.
//!
//! Owns: framing only. Must not touch: verification policy, the store, scores.
//!
//! Chunk stream (`/echo-swarm/chunk-stream/1.0.0`), parent → child:
//! ```text
//! parent: "ECS" 1 | u32 manifest_len | signed manifest | u32 plan_len | signed plan (0 = none)
//! child:  u8 status (0 accept, 1 refuse) | if accept: u32 bitmap_len | bitmap (bit i = holds chunk i)
//! parent: repeated { u32 index | u32 len | len bytes }, then u32 0xFFFF_FFFF | u32 0
//! ```
//! Chunk fetch (`/echo-swarm/chunk-fetch/1.0.0`), requester → holder:
//! ```text
//! request:  "ECF" 1 | u64 version | u32 count (≤ MAX_FETCH_BATCH) | count × 32-byte BLAKE3 hash
//! response: per hash, in order: u8 found | if found: u32 len | len bytes
//! ```
//! A request with `count = 0` asks for the holder's signed manifest of `version`
//! (`u64::MAX` = its newest) and its plan for it: `u32 len | manifest | u32 len | plan`
//! (0 = none) — the catch-up of late joiners.

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub const STREAM_MAGIC: &[u8; 4] = b"ECS\x01";
pub const FETCH_MAGIC: &[u8; 4] = b"ECF\x01";
/// Largest signed manifest carried in a stream hello (1 M chunks × 32 B + header).
pub const MAX_MANIFEST_BYTES: u32 = 256 + 32 * (1 << 20) + 64;
/// Largest chunk frame (the manifest format's maximum chunk size).
pub const MAX_CHUNK_BYTES: u32 = 64 << 20;
/// Most hashes in one fetch request.
pub const MAX_FETCH_BATCH: u32 = 64;
/// Index value that ends a chunk stream.
pub const END_OF_STREAM: u32 = u32::MAX;

pub async fn read_u8<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<u8> {
    let mut b = [0u8; 1];
    r.read_exact(&mut b).await?;
    Ok(b[0])
}

pub async fn read_u32<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b).await?;
    Ok(u32::from_be_bytes(b))
}

pub async fn read_u64<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b).await?;
    Ok(u64::from_be_bytes(b))
}

fn too_long(what: &str, n: u32, max: u32) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("{what} of {n} bytes exceeds the limit of {max}"),
    )
}

/// Reads a `u32` length (≤ `max`) followed by that many bytes.
pub async fn read_blob<R: AsyncRead + Unpin>(
    r: &mut R,
    what: &str,
    max: u32,
) -> std::io::Result<Vec<u8>> {
    let n = read_u32(r).await?;
    if n > max {
        return Err(too_long(what, n, max));
    }
    let mut v = vec![0u8; n as usize];
    r.read_exact(&mut v).await?;
    Ok(v)
}

pub async fn write_blob<W: AsyncWrite + Unpin>(w: &mut W, b: &[u8]) -> std::io::Result<()> {
    w.write_all(&(b.len() as u32).to_be_bytes()).await?;
    w.write_all(b).await
}

/// Reads a 4-byte magic and checks it.
pub async fn expect_magic<R: AsyncRead + Unpin>(r: &mut R, magic: &[u8; 4]) -> std::io::Result<()> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b).await?;
    if &b != magic {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("bad magic/version {b:?} (expected {magic:?})"),
        ));
    }
    Ok(())
}

/// Bitmap of `n` bits, bit `i` = `has(i)`.
pub fn bitmap(n: usize, has: impl Fn(usize) -> bool) -> Vec<u8> {
    let mut out = vec![0u8; n.div_ceil(8)];
    for i in 0..n {
        if has(i) {
            out[i / 8] |= 1 << (i % 8);
        }
    }
    out
}

pub fn bit(map: &[u8], i: usize) -> bool {
    map.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmaps() {
        let m = bitmap(11, |i| i % 3 == 0);
        assert_eq!(m.len(), 2);
        assert!((0..11).all(|i| bit(&m, i) == (i % 3 == 0)));
        assert!(!bit(&m, 100));
    }

    #[tokio::test]
    async fn blobs_respect_limits() {
        let mut buf = Vec::new();
        write_blob(&mut buf, &[1, 2, 3]).await.unwrap();
        let mut r = futures::io::Cursor::new(buf.clone());
        assert_eq!(read_blob(&mut r, "x", 3).await.unwrap(), [1, 2, 3]);
        let mut r = futures::io::Cursor::new(buf);
        assert!(read_blob(&mut r, "x", 2).await.is_err());
    }
}
