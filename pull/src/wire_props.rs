//! Property tests of the trajectory-pull messages and their frames ([`super`]): what a worker
//! or a learner reads from its peer. Test-only.
//!
//! Owns: a strategy for valid messages, a source that would serve gigabytes and counts what it
//! serves, and the properties — no panic on hostile bytes, round trip (bodies and frames), a
//! length above its limit refused after reading only the length. Must not touch: the wire
//! format.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::{AsyncRead, FutureExt};
use proptest::prelude::*;
use storage::codec::Writer;

use super::{read_message, write_message, Message, MAX_FRAME, T_ERROR, T_GROUP};
use crate::PullError;

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        any::<(u64, u64, u64, Option<u64>)>().prop_map(
            |(v_min, max_groups, ttl_ms, commits_from)| Message::Pull {
                v_min,
                max_groups,
                ttl_ms,
                commits_from,
            }
        ),
        (any::<(u64, u64)>(), log()).prop_map(|((lease_id, count), log)| Message::Lease {
            lease_id,
            count,
            log
        }),
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(|bytes| Message::Group { bytes }),
        log().prop_map(|log| Message::Empty { log }),
        any::<u64>().prop_map(|lease_id| Message::Ack { lease_id }),
        any::<u64>().prop_map(|lease_id| Message::Release { lease_id }),
        any::<u64>().prop_map(|consumed| Message::Done { consumed }),
        proptest::collection::vec(any::<char>(), 0..32).prop_map(|c| Message::Error {
            message: String::from_iter(c)
        }),
    ]
}

fn log() -> impl Strategy<Value = super::CommitLog> {
    (
        0u64..1 << 40,
        proptest::collection::vec((0u64..4, any::<Option<u8>>(), any::<bool>()), 0..12),
    )
        .prop_map(|(from, es)| super::CommitLog {
            from,
            entries: es
                .into_iter()
                .map(|(version, h, abandoned)| super::LogEntry {
                    version,
                    committed: match h {
                        Some(b) => super::Committed::Hash([b; 32]),
                        None if abandoned => super::Committed::Abandoned,
                        None => super::Committed::Omitted,
                    },
                })
                .collect(),
        })
}

/// An alteration of a valid encoding: flip bits of a byte, insert, delete, truncate, append.
fn mutate(bytes: &[u8], kind: u8, at: usize, x: u8) -> Vec<u8> {
    let mut b = bytes.to_vec();
    let n = b.len().max(1);
    match kind % 5 {
        0 if !b.is_empty() => b[at % n] ^= x.max(1),
        1 => b.insert(at % (b.len() + 1), x),
        2 if !b.is_empty() => {
            b.remove(at % n);
        }
        3 => b.truncate(at % n),
        _ => b.push(x),
    }
    b
}

fn varint(v: u64) -> Vec<u8> {
    let mut w = Writer::default();
    w.varint(v);
    w.into_bytes()
}

/// Serves `header`, then zero bytes without end; fails the test when asked for more than
/// `bound` bytes in all.
struct Hostile {
    header: Vec<u8>,
    served: usize,
    bound: usize,
}

impl AsyncRead for Hostile {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let n = buf.len();
        assert!(
            self.served + n <= self.bound,
            "asked for {} bytes, more than the {} it may read",
            self.served + n,
            self.bound
        );
        for (i, b) in buf.iter_mut().enumerate() {
            *b = self.header.get(self.served + i).copied().unwrap_or(0);
        }
        self.served += n;
        Poll::Ready(Ok(n))
    }
}

/// Runs a future over in-memory I/O, which never returns `Pending`.
fn now<T>(f: impl std::future::Future<Output = T>) -> T {
    f.now_or_never()
        .expect("in-memory I/O completes without waiting")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn messages_round_trip_as_bodies_and_as_frames(msgs in proptest::collection::vec(message(), 1..4)) {
        let mut wire = Vec::new();
        for m in &msgs {
            prop_assert_eq!(&Message::decode(&m.encode()).unwrap(), m);
            now(write_message(&mut wire, m)).unwrap();
        }
        let mut r = futures::io::Cursor::new(wire);
        for m in &msgs {
            prop_assert_eq!(&now(read_message(&mut r)).unwrap().unwrap(), m);
        }
        prop_assert!(now(read_message(&mut r)).unwrap().is_none());
    }

    #[test]
    fn hostile_bodies_never_panic_and_truncations_fail(
        m in message(),
        random in proptest::collection::vec(any::<u8>(), 0..128),
        kind: u8,
        at: usize,
        x: u8,
    ) {
        let bytes = m.encode();
        let mutated = mutate(&bytes, kind, at, x);
        let r = Message::decode(&mutated);
        if mutated.len() < bytes.len() && bytes.starts_with(&mutated) {
            prop_assert!(r.is_err(), "a truncation decoded");
        }
        let _ = Message::decode(&random);
        // The same bytes as a stream of frames.
        let mut s = futures::io::Cursor::new(random);
        while let Ok(Some(_)) = now(read_message(&mut s)) {}
    }

    #[test]
    fn a_frame_over_the_limit_is_refused_after_reading_only_its_length(
        len in (MAX_FRAME as u64 + 1)..=u64::MAX,
    ) {
        let header = varint(len);
        let bound = header.len();
        let mut src = Hostile { header, served: 0, bound };
        let err = now(read_message(&mut src)).unwrap_err();
        // More than any message may be: an oversized answer (a strike), not a mere I/O error.
        prop_assert!(matches!(err, PullError::OversizedAnswer(_)), "{}", err);
        prop_assert_eq!(src.served, bound);
    }

    #[test]
    fn a_group_or_error_length_over_its_limit_is_refused(
        bytes in proptest::collection::vec(any::<u8>(), 0..64),
        huge in (MAX_FRAME as u64 + 1)..=u64::MAX,
        text_len in 4097u64..=u64::MAX,
    ) {
        // The body's own length prefix, patched past its limit inside a small frame.
        let mut body = vec![T_GROUP];
        body.extend_from_slice(&varint(huge));
        body.extend_from_slice(&bytes);
        let err = Message::decode(&body).unwrap_err().to_string();
        prop_assert!(err.contains("exceeds"), "{}", err);
        let mut body = vec![T_ERROR];
        body.extend_from_slice(&varint(text_len));
        body.extend_from_slice(&bytes);
        let err = Message::decode(&body).unwrap_err().to_string();
        prop_assert!(err.contains("exceeds"), "{}", err);
    }
}
