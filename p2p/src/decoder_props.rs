//! Property tests of this crate's decoders that a peer's bytes reach: the gossiped heartbeat
//! and score table ([`crate::messages`], size-limited JSON) and the frame reader of every bulk
//! stream protocol ([`crate::framing`]). Test-only.
//!
//! Owns: strategies for valid heartbeats and score tables, an `AsyncRead` that would serve
//! gigabytes and counts what it serves, and the properties — no panic on hostile bytes, round
//! trip, a length above the limit refused after reading only the length. Must not touch: the
//! message types or the framing.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::{AsyncRead, FutureExt};
use proptest::prelude::*;

use crate::framing::{read_frame, try_read_frame, write_frame, MAX_LENGTH_BYTES};
use crate::messages::{
    DeviceReport, Heartbeat, ScoreEntry, ScoreTable, HEARTBEAT_VERSION, MAX_HEARTBEAT_BYTES,
    MAX_SCORE_TABLE_BYTES, SCORE_TABLE_VERSION,
};
use crate::{peer_id_from_seed, MessageError, Role};

const SWARM: &str = "swarm";

/// Up to `max_chars` characters, none of them a control character.
fn printable(max_chars: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(
        any::<char>().prop_filter("no control", |c| !c.is_control()),
        0..=max_chars,
    )
    .prop_map(String::from_iter)
}

fn device() -> impl Strategy<Value = DeviceReport> {
    (
        prop::sample::select(DeviceReport::KINDS.to_vec()),
        printable(24),
        any::<u64>(),
        any::<u64>(),
        proptest::option::of(printable(4)),
        proptest::option::of(prop::sample::select(DeviceReport::DTYPES.to_vec())),
        proptest::option::of((
            0.0f32..=crate::messages::SamplingReport::MAX_TEMPERATURE,
            0.001f32..=1.0,
            1..=crate::messages::MAX_SAMPLING_TOKENS as u32,
        )),
    )
        .prop_map(
            |(kind, name, total, free, compute_capability, dtype, sampling)| DeviceReport {
                kind: kind.into(),
                name,
                memory_total_bytes: total,
                memory_free_bytes: free % total.saturating_add(1),
                compute_capability,
                // No node samples in bf16 on a CPU (such a report is refused).
                dtype: dtype
                    .filter(|d| !(kind == "cpu" && *d == "bf16"))
                    .map(Into::into),
                sampling: sampling.map(|(temperature, top_p, max_new_tokens)| {
                    crate::messages::SamplingReport {
                        temperature,
                        top_p,
                        max_new_tokens,
                        env_pin: None,
                    }
                }),
            },
        )
}

fn heartbeat() -> impl Strategy<Value = Heartbeat> {
    (
        (
            prop::sample::select(Role::ALL.to_vec()),
            printable(16),
            proptest::option::of(any::<u64>()),
            0.0f64..=1e9,
            0.0f64..=1e6,
            0.0f64..=1.0,
        ),
        (
            0..=crate::messages::MAX_PENDING_CLAIM,
            0.0f64..=1e15,
            0.0f64..=1e15,
            any::<(u64, u64, u64)>(),
            proptest::option::of(device()),
        ),
    )
        .prop_map(
            |(
                (role, node_version, installed_version, mu, cost_per_hour, availability),
                (pending, forward_rate_bps, receive_rate_bps, (started, sent, seq), device),
            )| Heartbeat {
                v: HEARTBEAT_VERSION,
                swarm_id: SWARM.into(),
                role,
                node_version,
                installed_version,
                mu,
                cost_per_hour,
                availability,
                pending,
                forward_rate_bps,
                receive_rate_bps,
                started_unix_ms: started,
                sent_unix_ms: sent,
                seq,
                device,
                reachability: None,
                addrs: Vec::new(),
                receipts: Vec::new(),
                admission: None,
                install_age_ms: None,
            },
        )
}

fn score_table() -> impl Strategy<Value = ScoreTable> {
    let entry = (
        any::<[u8; 32]>(),
        [
            0.0f64..=100.0,
            0.0f64..=100.0,
            0.0f64..=100.0,
            0.0f64..=100.0,
        ],
        0.0f64..=1.0,
    )
        .prop_map(
            |(seed, [score, speed, success, stability], decay)| ScoreEntry {
                peer_id: peer_id_from_seed(seed).to_string(),
                score,
                speed,
                success,
                stability,
                decay,
                contribution: None,
            },
        );
    (any::<u64>(), proptest::collection::vec(entry, 0..6)).prop_map(|(sent_unix_ms, entries)| {
        ScoreTable {
            v: SCORE_TABLE_VERSION,
            swarm_id: SWARM.into(),
            sent_unix_ms,
            entries,
        }
    })
}

/// An alteration of a valid encoding: flip bits of a byte, insert, delete, truncate.
fn mutate(bytes: &[u8], kind: u8, at: usize, x: u8) -> Vec<u8> {
    let mut b = bytes.to_vec();
    let n = b.len().max(1);
    match kind % 4 {
        0 if !b.is_empty() => b[at % n] ^= x.max(1),
        1 => b.insert(at % (b.len() + 1), x),
        2 if !b.is_empty() => {
            b.remove(at % n);
        }
        _ => b.truncate(at % n),
    }
    b
}

/// Serves `header`, then zero bytes without end (gigabytes, if asked); fails the test when
/// asked for more than `bound` bytes in all.
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
            "the reader asked for {} bytes, more than the {} it may read",
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

fn varint(v: u64) -> Vec<u8> {
    let mut buf = unsigned_varint::encode::u64_buffer();
    unsigned_varint::encode::u64(v, &mut buf).to_vec()
}

/// Runs a future over in-memory readers and writers, which never return `Pending`.
fn now<T>(f: impl std::future::Future<Output = T>) -> T {
    f.now_or_never()
        .expect("in-memory I/O completes without waiting")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn heartbeats_round_trip(h in heartbeat()) {
        let bytes = h.encode();
        prop_assert!(bytes.len() <= MAX_HEARTBEAT_BYTES);
        prop_assert_eq!(Heartbeat::decode(&bytes, SWARM).unwrap(), h);
    }

    #[test]
    fn score_tables_round_trip(t in score_table()) {
        prop_assert_eq!(ScoreTable::decode(&t.encode(), SWARM).unwrap(), t);
    }

    #[test]
    fn hostile_gossip_bytes_never_panic_and_what_decodes_is_valid(
        h in heartbeat(),
        t in score_table(),
        random in proptest::collection::vec(any::<u8>(), 0..256),
        kind: u8,
        at: usize,
        x: u8,
    ) {
        for bytes in [mutate(&h.encode(), kind, at, x), random.clone()] {
            if let Ok(d) = Heartbeat::decode(&bytes, SWARM) {
                // Accepted means every check holds: it re-encodes to an accepted message.
                prop_assert!(Heartbeat::decode(&d.encode(), SWARM).is_ok());
            }
        }
        for bytes in [mutate(&t.encode(), kind, at, x), random] {
            if let Ok(d) = ScoreTable::decode(&bytes, SWARM) {
                prop_assert!(ScoreTable::decode(&d.encode(), SWARM).is_ok());
            }
        }
    }

    #[test]
    fn oversized_gossip_is_refused_by_its_size_alone(h in heartbeat(), pad in 1usize..64) {
        // Valid JSON, padded past the limit with whitespace: refused before parsing.
        let mut bytes = h.encode();
        bytes.resize(MAX_HEARTBEAT_BYTES + pad, b' ');
        let is_too_large = matches!(
            Heartbeat::decode(&bytes, SWARM),
            Err(MessageError::TooLarge { .. })
        );
        prop_assert!(is_too_large);
        bytes.resize(MAX_SCORE_TABLE_BYTES + pad, b' ');
        let is_too_large = matches!(
            ScoreTable::decode(&bytes, SWARM),
            Err(MessageError::TooLarge { .. })
        );
        prop_assert!(is_too_large);
    }

    #[test]
    fn frames_round_trip(
        bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..4),
        slack in 0usize..4,
    ) {
        let mut wire = Vec::new();
        for b in &bodies {
            now(write_frame(&mut wire, b)).unwrap();
        }
        let mut r = futures::io::Cursor::new(wire);
        for b in &bodies {
            prop_assert_eq!(&now(read_frame(&mut r, b.len() + slack, "t")).unwrap(), b);
        }
        prop_assert!(now(try_read_frame(&mut r, 0, "t")).unwrap().is_none());
    }

    #[test]
    fn a_frame_length_over_the_limit_is_refused_after_reading_only_the_length(
        max in 0usize..(1 << 20),
        over in 1u64..=u64::MAX,
    ) {
        let len = (max as u64).saturating_add(over);
        prop_assume!(len > max as u64);
        let header = varint(len);
        let bound = header.len();
        let mut src = Hostile { header, served: 0, bound };
        let err = now(read_frame(&mut src, max, "t")).unwrap_err();
        prop_assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        prop_assert_eq!(src.served, bound);
    }

    #[test]
    fn a_frame_reader_reads_no_further_than_its_frame(
        body in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        // The source would go on for ever; a reader that read ahead would fail the bound.
        let mut header = varint(body.len() as u64);
        let bound = header.len() + body.len();
        header.extend_from_slice(&body);
        let mut src = Hostile { header, served: 0, bound };
        prop_assert_eq!(now(read_frame(&mut src, body.len(), "t")).unwrap(), body);
        prop_assert_eq!(src.served, bound);
    }

    #[test]
    fn hostile_stream_bytes_never_panic_nor_over_read(
        bytes in proptest::collection::vec(any::<u8>(), 0..64),
        max in 0usize..64,
    ) {
        let mut r = futures::io::Cursor::new(bytes.clone());
        loop {
            let before = r.position();
            match now(try_read_frame(&mut r, max, "t")) {
                Ok(Some(body)) => {
                    prop_assert!(body.len() <= max);
                    prop_assert!(r.position() > before);
                }
                Ok(None) => {
                    prop_assert_eq!(r.position() as usize, bytes.len());
                    break;
                }
                Err(e) => {
                    prop_assert!(matches!(
                        e.kind(),
                        io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof
                    ));
                    // Never more than a length and the body it allowed.
                    prop_assert!(r.position() - before <= (MAX_LENGTH_BYTES + max) as u64);
                    break;
                }
            }
        }
    }

    #[test]
    fn a_truncated_frame_is_an_error(
        body in proptest::collection::vec(any::<u8>(), 1..300),
        cut: usize,
    ) {
        let mut wire = Vec::new();
        now(write_frame(&mut wire, &body)).unwrap();
        wire.truncate(1 + cut % (wire.len() - 1));
        let err = now(read_frame(&mut futures::io::Cursor::new(wire), body.len(), "t"))
            .unwrap_err();
        prop_assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }
}

/// Deep JSON nesting within the size limit (in a required field or in a tolerated unknown
/// one) is a schema error, not a stack overflow.
#[test]
fn deeply_nested_json_is_a_schema_error() {
    let depth = MAX_HEARTBEAT_BYTES / 2 - 20;
    let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    for json in [
        nested.clone(),
        format!(r#"{{"v":1,"swarm_id":"swarm","extra":{nested}}}"#),
        format!(r#"{{"v":1,"swarm_id":{nested}}}"#),
    ] {
        assert!(json.len() <= MAX_HEARTBEAT_BYTES, "{}", json.len());
        assert!(matches!(
            Heartbeat::decode(json.as_bytes(), SWARM),
            Err(MessageError::Schema(_))
        ));
    }
    let depth = MAX_SCORE_TABLE_BYTES / 2 - 100;
    let nested = format!("{}{}", "{\"a\":".repeat(depth / 5), "}".repeat(depth / 5));
    let json = format!(r#"{{"v":1,"swarm_id":"swarm","entries":[],"x":{nested}}}"#);
    assert!(json.len() <= MAX_SCORE_TABLE_BYTES);
    assert!(matches!(
        ScoreTable::decode(json.as_bytes(), SWARM),
        Err(MessageError::Schema(_))
    ));
}

/// Found by `heartbeats_round_trip`: without serde_json's exact float parsing this rate came
/// back one ULP off.
#[test]
fn floats_survive_json_exactly() {
    let h = Heartbeat {
        v: HEARTBEAT_VERSION,
        swarm_id: SWARM.into(),
        role: Role::Learner,
        node_version: String::new(),
        installed_version: None,
        mu: 0.0,
        cost_per_hour: 0.0,
        availability: 0.0,
        pending: 0,
        forward_rate_bps: 0.0,
        receive_rate_bps: 129_000_551_672_910.61,
        started_unix_ms: 0,
        sent_unix_ms: 0,
        seq: 0,
        device: None,
        reachability: None,
        addrs: Vec::new(),
        receipts: Vec::new(),
        admission: None,
        install_age_ms: None,
    };
    assert_eq!(
        Heartbeat::decode(&h.encode(), SWARM)
            .unwrap()
            .receive_rate_bps
            .to_bits(),
        h.receive_rate_bps.to_bits()
    );
}
