//! Wire format of [`TRAJECTORY_PULL`](crate::TRAJECTORY_PULL) (byte layouts: `docs/pull.md`).
//!
//! Owns: the pull messages and their bodies. Must not touch: framing (`p2p::framing`), the
//! store, the lease rules.
//!
//! Every message is one `p2p::framing` frame (an unsigned-varint body length, then the body);
//! the body is a tag byte and the fields in the compact encoding of `storage::codec` (varints,
//! length-prefixed bytes). Frames above [`MAX_FRAME`] are refused before anything is
//! allocated; trailing bytes in a body are an error.

use futures::{AsyncRead, AsyncWrite, AsyncWriteExt};
use p2p::framing::{self, FrameError};
use storage::codec::{Reader, Writer};

use crate::PullError;

/// Largest frame: one encoded trajectory group (`storage::record::limits::MAX_GROUP_BYTES`)
/// plus headroom for the message tag and length.
pub const MAX_FRAME: usize = storage::record::limits::MAX_GROUP_BYTES + 1024;
/// Largest message that is not a group (pull, lease, ack, release, done, empty, and an error
/// with its text of at most 4096 bytes).
pub const MAX_SMALL_MESSAGE: usize = 8 * 1024;
/// Most commitments one log carries (as `storage::trajectory::MAX_LOG_ENTRIES`).
pub const MAX_LOG_ENTRIES: usize = storage::trajectory::MAX_LOG_ENTRIES;
/// Largest lease or empty answer: a small message plus a full commit log (each entry at
/// worst its own run: two varints, a flag and a hash).
pub const MAX_LOG_MESSAGE: usize = MAX_SMALL_MESSAGE + MAX_LOG_ENTRIES * (10 + 10 + 1 + 32);
/// A group frame's body beyond the encoded group: the tag byte and the group's varint length.
pub const GROUP_FRAME_OVERHEAD: usize = 16;
/// Most groups one lease may carry.
pub const MAX_GROUPS_PER_LEASE: u64 = 1024;
/// Bounds on the lease time a learner may ask for.
pub const MIN_TTL_MS: u64 = 100;
pub const MAX_TTL_MS: u64 = 3_600_000;

/// What one number of a [`CommitLog`] commits to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Committed {
    /// A group, admissible (`version ≥ v_min` of the pull): its content hash.
    Hash([u8; 32]),
    /// A group whose hash is left out: stale (`version < v_min`), resolved by its version.
    Omitted,
    /// No group: its episode failed in the environment program.
    Abandoned,
}

impl Committed {
    fn flag(&self) -> u8 {
        match self {
            Committed::Omitted => 0,
            Committed::Hash(_) => 1,
            Committed::Abandoned => 2,
        }
    }
}

/// One commitment of a [`CommitLog`]: the version of the group the number was stored (or
/// attempted) with and what it commits to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogEntry {
    pub version: u64,
    pub committed: Committed,
}

/// The worker's commitments from number `from` on: entry `i` commits number `from + i`
/// (`control::commits`). On the wire: `from`, then runs of one version and kind — the
/// version, the count, a flag byte (1: a content hash per entry follows; 0: none, stale;
/// 2: none, abandoned) and the hashes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitLog {
    pub from: u64,
    pub entries: Vec<LogEntry>,
}

impl CommitLog {
    /// The log of `read`, with the hashes of entries below `v_min` left out (stale: the
    /// learner resolves them by their version alone, abandoned or not).
    pub fn of(read: &storage::trajectory::CommitLogRead, v_min: u64) -> Self {
        use storage::trajectory::CommitRecord;
        CommitLog {
            from: read.from,
            entries: read
                .entries
                .iter()
                .map(|r| LogEntry {
                    version: r.version(),
                    committed: match *r {
                        _ if r.version() < v_min => Committed::Omitted,
                        CommitRecord::Group { hash, .. } => Committed::Hash(hash),
                        CommitRecord::Abandoned { .. } => Committed::Abandoned,
                    },
                })
                .collect(),
        }
    }

    fn encode(&self, w: &mut Writer) {
        w.varint(self.from);
        let mut runs: Vec<(u64, u8, Vec<&LogEntry>)> = Vec::new();
        for e in &self.entries {
            let flag = e.committed.flag();
            match runs.last_mut() {
                Some((v, f, es)) if *v == e.version && *f == flag => es.push(e),
                _ => runs.push((e.version, flag, vec![e])),
            }
        }
        w.varint(runs.len() as u64);
        for (v, flag, es) in runs {
            w.varint(v);
            w.varint(es.len() as u64);
            w.u8(flag);
            for e in es {
                if let Committed::Hash(h) = e.committed {
                    w.raw(&h);
                }
            }
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, storage::StorageError> {
        let from = r.varint()?;
        let runs = r.len(MAX_LOG_ENTRIES, 3, "commit runs")?;
        let mut entries = Vec::new();
        for _ in 0..runs {
            let version = r.varint()?;
            let n = r.varint()?;
            if n == 0 || entries.len() as u64 + n > MAX_LOG_ENTRIES as u64 {
                return Err(r.err(format!("a commit run of {n} entries")));
            }
            let flag = r.u8()?;
            for _ in 0..n {
                let committed = match flag {
                    0 => Committed::Omitted,
                    1 => Committed::Hash(r.array::<32>()?),
                    2 => Committed::Abandoned,
                    f => return Err(r.err(format!("commit run flag {f}"))),
                };
                entries.push(LogEntry { version, committed });
            }
        }
        if from.checked_add(entries.len() as u64).is_none() {
            return Err(r.err("commit log past the last number"));
        }
        Ok(CommitLog { from, entries })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Learner → worker: lease up to `max_groups` groups with `version ≥ v_min` for `ttl_ms`,
    /// with the commit log from `commits_from` (from the worker's oldest kept entry when
    /// `None`: a worker this learner has not met). Supersedes every earlier lease.
    Pull {
        v_min: u64,
        max_groups: u64,
        ttl_ms: u64,
        commits_from: Option<u64>,
    },
    /// Worker → learner: a lease of `count` groups follows, one [`Message::Group`] each; `log`
    /// holds the commitments taken with it.
    Lease {
        lease_id: u64,
        count: u64,
        log: CommitLog,
    },
    /// Worker → learner: one encoded `TrajectoryGroup`.
    Group { bytes: Vec<u8> },
    /// Worker → learner: nothing admissible is pending; the commitments since the last log.
    Empty { log: CommitLog },
    /// Learner → worker: the lease's groups are stored durably; delete them.
    Ack { lease_id: u64 },
    /// Learner → worker: give the lease back unused.
    Release { lease_id: u64 },
    /// Worker → learner: the ack or release was applied; `consumed` groups were deleted.
    Done { consumed: u64 },
    /// Either side: the request was refused.
    Error { message: String },
}

const T_PULL: u8 = 1;
const T_LEASE: u8 = 2;
const T_GROUP: u8 = 3;
const T_EMPTY: u8 = 4;
const T_ACK: u8 = 5;
const T_RELEASE: u8 = 6;
const T_DONE: u8 = 7;
const T_ERROR: u8 = 8;

impl Message {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            Message::Pull {
                v_min,
                max_groups,
                ttl_ms,
                commits_from,
            } => {
                w.u8(T_PULL);
                w.varint(*v_min);
                w.varint(*max_groups);
                w.varint(*ttl_ms);
                match commits_from {
                    None => w.u8(0),
                    Some(f) => {
                        w.u8(1);
                        w.varint(*f);
                    }
                }
            }
            Message::Lease {
                lease_id,
                count,
                log,
            } => {
                w.u8(T_LEASE);
                w.varint(*lease_id);
                w.varint(*count);
                log.encode(&mut w);
            }
            Message::Group { bytes } => {
                w.u8(T_GROUP);
                w.bytes(bytes);
            }
            Message::Empty { log } => {
                w.u8(T_EMPTY);
                log.encode(&mut w);
            }
            Message::Ack { lease_id } => {
                w.u8(T_ACK);
                w.varint(*lease_id);
            }
            Message::Release { lease_id } => {
                w.u8(T_RELEASE);
                w.varint(*lease_id);
            }
            Message::Done { consumed } => {
                w.u8(T_DONE);
                w.varint(*consumed);
            }
            Message::Error { message } => {
                w.u8(T_ERROR);
                w.str(message);
            }
        }
        w.into_bytes()
    }

    pub fn decode(body: &[u8]) -> Result<Self, PullError> {
        let bad = |e: storage::StorageError| PullError::Protocol(e.to_string());
        let mut r = Reader::new(body, "pull message");
        let msg = match r.u8().map_err(bad)? {
            T_PULL => Message::Pull {
                v_min: r.varint().map_err(bad)?,
                max_groups: r.varint().map_err(bad)?,
                ttl_ms: r.varint().map_err(bad)?,
                commits_from: match r.u8().map_err(bad)? {
                    0 => None,
                    1 => Some(r.varint().map_err(bad)?),
                    f => return Err(PullError::Protocol(format!("commits_from flag {f}"))),
                },
            },
            T_LEASE => Message::Lease {
                lease_id: r.varint().map_err(bad)?,
                count: r.varint().map_err(bad)?,
                log: CommitLog::decode(&mut r).map_err(bad)?,
            },
            T_GROUP => Message::Group {
                bytes: r.bytes(MAX_FRAME, "group").map_err(bad)?.to_vec(),
            },
            T_EMPTY => Message::Empty {
                log: CommitLog::decode(&mut r).map_err(bad)?,
            },
            T_ACK => Message::Ack {
                lease_id: r.varint().map_err(bad)?,
            },
            T_RELEASE => Message::Release {
                lease_id: r.varint().map_err(bad)?,
            },
            T_DONE => Message::Done {
                consumed: r.varint().map_err(bad)?,
            },
            T_ERROR => Message::Error {
                message: r.string(4096, "message").map_err(bad)?,
            },
            t => return Err(PullError::Protocol(format!("unknown message tag {t}"))),
        };
        r.finish().map_err(bad)?;
        Ok(msg)
    }
}

pub async fn write_message<W: AsyncWrite + Unpin>(
    w: &mut W,
    msg: &Message,
) -> Result<(), PullError> {
    framing::write_frame(w, &msg.encode()).await?;
    w.flush().await?;
    Ok(())
}

/// Reads one message of any size up to [`MAX_FRAME`]; `Ok(None)` at a clean end of stream
/// before a frame starts.
pub async fn read_message<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Message>, PullError> {
    read_message_bounded(r, MAX_FRAME).await
}

/// Reads one message whose frame is at most `max` bytes (≤ [`MAX_FRAME`]); a longer one is
/// refused before anything is allocated, as [`PullError::OversizedAnswer`].
pub async fn read_message_bounded<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
) -> Result<Option<Message>, PullError> {
    match framing::try_read_frame(r, max.min(MAX_FRAME), "pull message").await {
        Ok(Some(body)) => Message::decode(&body).map(Some),
        Ok(None) => Ok(None),
        // A length above the bound: the peer sent more than was asked for.
        Err(e @ FrameError::TooLarge { .. }) => Err(PullError::OversizedAnswer(e.to_string())),
        // A malformed length: the peer broke the protocol.
        Err(e @ FrameError::Malformed { .. }) => Err(PullError::Protocol(e.to_string())),
        Err(e) => Err(std::io::Error::from(e).into()),
    }
}

#[cfg(test)]
#[path = "wire_props.rs"]
mod props;

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of `docs/pull.md`.
    #[test]
    fn a_commit_log_is_encoded_in_runs_of_one_version() {
        let log = CommitLog {
            from: 40,
            entries: vec![
                LogEntry {
                    version: 1,
                    committed: Committed::Omitted,
                },
                LogEntry {
                    version: 3,
                    committed: Committed::Hash([0xaa; 32]),
                },
                LogEntry {
                    version: 3,
                    committed: Committed::Hash([0xbb; 32]),
                },
            ],
        };
        let mut w = Writer::default();
        log.encode(&mut w);
        let mut want = vec![0x28, 2, 1, 1, 0, 3, 2, 1];
        want.extend([0xaa; 32]);
        want.extend([0xbb; 32]);
        assert_eq!(w.into_bytes(), want);
        // A run of zero entries, a bad flag, or more entries than the bound are refused.
        for bad in [
            vec![0, 1, 5, 0, 0],
            vec![0, 1, 5, 1, 3],
            vec![0, 1, 5, 0xff, 0xff, 0x07, 0],
        ] {
            assert!(
                CommitLog::decode(&mut Reader::new(&bad, "log")).is_err(),
                "{bad:?}"
            );
        }
        // An abandoned run: flag 2, no hashes.
        let abandoned = CommitLog {
            from: 9,
            entries: vec![LogEntry {
                version: 4,
                committed: Committed::Abandoned,
            }],
        };
        let mut w = Writer::default();
        abandoned.encode(&mut w);
        let bytes = w.into_bytes();
        assert_eq!(bytes, [9, 1, 4, 1, 2]);
        assert_eq!(
            CommitLog::decode(&mut Reader::new(&bytes, "log")).unwrap(),
            abandoned
        );
        // Stale entries lose their hash (abandoned or not); admissible ones keep what they are.
        use storage::trajectory::CommitRecord;
        let read = storage::trajectory::CommitLogRead {
            from: 7,
            entries: vec![
                CommitRecord::Group {
                    version: 1,
                    hash: [1; 32],
                },
                CommitRecord::Group {
                    version: 5,
                    hash: [2; 32],
                },
                CommitRecord::Abandoned { version: 1 },
                CommitRecord::Abandoned { version: 6 },
            ],
        };
        let l = CommitLog::of(&read, 5);
        let got: Vec<Committed> = l.entries.iter().map(|e| e.committed).collect();
        assert_eq!(
            got,
            [
                Committed::Omitted,
                Committed::Hash([2; 32]),
                Committed::Omitted,
                Committed::Abandoned
            ]
        );
    }

    #[test]
    fn messages_round_trip_and_garbage_is_an_error() {
        let all = [
            Message::Pull {
                v_min: 3,
                max_groups: 64,
                ttl_ms: 30_000,
                commits_from: None,
            },
            Message::Pull {
                v_min: 3,
                max_groups: 64,
                ttl_ms: 30_000,
                commits_from: Some(41),
            },
            Message::Lease {
                lease_id: 7,
                count: 2,
                log: CommitLog {
                    from: 40,
                    entries: vec![
                        LogEntry {
                            version: 1,
                            committed: Committed::Omitted,
                        },
                        LogEntry {
                            version: 3,
                            committed: Committed::Hash([7; 32]),
                        },
                        LogEntry {
                            version: 3,
                            committed: Committed::Hash([8; 32]),
                        },
                    ],
                },
            },
            Message::Group {
                bytes: vec![1, 2, 3],
            },
            Message::Empty {
                log: CommitLog::default(),
            },
            Message::Ack { lease_id: 7 },
            Message::Release { lease_id: 8 },
            Message::Done { consumed: 2 },
            Message::Error {
                message: "no".into(),
            },
        ];
        for m in all {
            let bytes = m.encode();
            assert_eq!(Message::decode(&bytes).unwrap(), m);
            for cut in 0..bytes.len() {
                assert!(Message::decode(&bytes[..cut]).is_err() || cut == bytes.len());
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(Message::decode(&longer).is_err());
        }
        assert!(Message::decode(&[99]).is_err());
        // Random bytes never panic.
        let mut x = 0x9e3779b97f4a7c15u64;
        for _ in 0..2000 {
            let n = (x % 40) as usize;
            let bytes: Vec<u8> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = Message::decode(&bytes);
        }
    }

    fn write_frame_sync(out: &mut Vec<u8>, body: &[u8]) {
        futures::executor::block_on(framing::write_frame(out, body)).unwrap();
    }

    #[test]
    fn oversized_frames_are_refused_before_allocation() {
        // A varint length of MAX_FRAME + 1 (LEB128), then a few body bytes.
        let mut frame = Vec::new();
        let mut n = (MAX_FRAME + 1) as u64;
        while n >= 0x80 {
            frame.push(n as u8 | 0x80);
            n >>= 7;
        }
        frame.push(n as u8);
        frame.extend_from_slice(&[0; 16]);
        let mut r = futures::io::Cursor::new(frame);
        let err = futures::executor::block_on(read_message(&mut r)).unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
        assert!(matches!(err, PullError::OversizedAnswer(_)), "{err:?}");
        // Within a smaller bound: a frame one byte over it is oversized, one at it is read.
        let empty = Message::Empty {
            log: CommitLog::default(),
        };
        let body = empty.encode();
        let mut frame = Vec::new();
        write_frame_sync(&mut frame, &body);
        let mut r = futures::io::Cursor::new(frame.clone());
        assert_eq!(
            futures::executor::block_on(read_message_bounded(&mut r, body.len())).unwrap(),
            Some(empty)
        );
        let mut r = futures::io::Cursor::new(frame);
        let err =
            futures::executor::block_on(read_message_bounded(&mut r, body.len() - 1)).unwrap_err();
        assert!(matches!(err, PullError::OversizedAnswer(_)), "{err:?}");
        // A malformed length is a protocol violation, not an oversized answer.
        let mut r = futures::io::Cursor::new(vec![0x80u8; 11]);
        let err = futures::executor::block_on(read_message_bounded(&mut r, 100)).unwrap_err();
        assert!(matches!(err, PullError::Protocol(_)), "{err:?}");
        let mut empty = futures::io::Cursor::new(Vec::new());
        assert!(futures::executor::block_on(read_message(&mut empty))
            .unwrap()
            .is_none());
    }
}
