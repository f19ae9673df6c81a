//! Admission credentials (`docs/protocol.md`, "Admission"): what a worker presents so that a
//! learner admitting only some identities pulls from it.
//!
//! - **Ticket** ([`Ticket`]): the learner's signature over (swarm id, peer id, expiry) — an
//!   expiring admission for one peer id, written by `echo-node admit PEER_ID --hours H`. A
//!   ticket names the peer it admits, so a copy is worth nothing to anyone else (a heartbeat's
//!   author is authenticated by gossipsub's message signature).
//! - **Proof of work** ([`work_hash`], [`solve_work`]): a nonce such that
//!   `BLAKE3(WORK_CONTEXT ‖ swarm id ‖ peer id ‖ nonce)` starts with `bits` zero bits; minting
//!   an identity an open swarm accepts costs about `2^bits` hashes. Bound to the peer id and
//!   swarm, so it is paid once per identity and cannot be reused.
//! - **Credential** ([`Credential`]): either or both, carried hex-encoded in the worker's
//!   heartbeats (field `admission`).
//!
//! Owns the formats and their checks (pure, no clock: callers pass `now`). Must not touch:
//! which mode a learner runs in or what it does with a peer that is not admitted.
//!
//! # Formats (version 1)
//!
//! ```text
//! ticket:     magic "ETK" | u8 format (1) | str swarm_id | str peer_id (base58)
//!             | varint issued_unix_s | varint expires_unix_s | 64-byte ed25519 signature
//! credential: magic "EAC" | u8 format (1) | u8 has_ticket [bytes ticket]
//!             | u8 has_work [varint nonce]
//! ```
//! `str` and `bytes` are LEB128-length-prefixed (`storage::codec`). The ticket's signature is
//! over `TICKET_CONTEXT ‖ BLAKE3(everything before the signature)`, by the learner's key.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

use crate::codec::{Reader, Writer};
use crate::error::{Result, StorageError};

/// Prefix of what the learner signs for a ticket.
pub const TICKET_CONTEXT: &[u8] = b"echo-swarm/admission-ticket/v1";
/// Prefix of the proof-of-work hash.
pub const WORK_CONTEXT: &[u8] = b"echo-swarm/admission-work/v1";
/// Current format of tickets and credentials.
pub const ADMISSION_FORMAT: u8 = 1;
/// Largest encoded credential (bytes), so its hex fits a heartbeat field of 1 KiB.
pub const MAX_CREDENTIAL_BYTES: usize = 512;
const MAX_ID: usize = 128;

/// An expiring, learner-signed admission of one peer id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    pub swarm_id: String,
    /// The admitted peer (base58).
    pub peer_id: String,
    pub issued_unix_s: u64,
    pub expires_unix_s: u64,
    pub signature: [u8; 64],
}

/// Why a ticket does not admit a peer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    #[error("the ticket is for swarm {0:?}")]
    OtherSwarm(String),
    #[error("the ticket admits {0}, not this peer")]
    OtherPeer(String),
    #[error("the ticket expired at {expired} (now {now}, Unix seconds)")]
    Expired { expired: u64, now: u64 },
    #[error("the ticket is not signed by this swarm's learner")]
    BadSignature,
}

impl Ticket {
    /// A ticket for `peer_id` in `swarm_id`, valid from `now_unix_s` for `hours`, signed by
    /// the learner's `key`.
    pub fn issue(
        key: &SigningKey,
        swarm_id: &str,
        peer_id: &str,
        now_unix_s: u64,
        hours: u64,
    ) -> Result<Self> {
        if swarm_id.len() > MAX_ID || peer_id.len() > MAX_ID {
            return Err(StorageError::invalid("ticket", "swarm or peer id too long"));
        }
        let mut t = Ticket {
            swarm_id: swarm_id.into(),
            peer_id: peer_id.into(),
            issued_unix_s: now_unix_s,
            expires_unix_s: now_unix_s.saturating_add(hours.saturating_mul(3600)),
            signature: [0; 64],
        };
        t.signature = key.sign(&t.signing_message()).to_bytes();
        Ok(t)
    }

    fn content(&self) -> Writer {
        let mut w = Writer::with_capacity(160);
        w.raw(b"ETK");
        w.u8(ADMISSION_FORMAT);
        w.str(&self.swarm_id);
        w.str(&self.peer_id);
        w.varint(self.issued_unix_s);
        w.varint(self.expires_unix_s);
        w
    }

    fn signing_message(&self) -> Vec<u8> {
        let hash = blake3::hash(&self.content().into_bytes());
        [TICKET_CONTEXT, hash.as_bytes()].concat()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = self.content();
        w.raw(&self.signature);
        w.into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let mut r = Reader::new(bytes, "admission ticket");
        if r.raw(3)? != b"ETK" {
            return Err(r.err("bad magic"));
        }
        let format = r.u8()?;
        if format != ADMISSION_FORMAT {
            return Err(r.err(format!(
                "format {format} (this build reads {ADMISSION_FORMAT})"
            )));
        }
        let t = Ticket {
            swarm_id: r.string(MAX_ID, "swarm_id")?,
            peer_id: r.string(MAX_ID, "peer_id")?,
            issued_unix_s: r.varint()?,
            expires_unix_s: r.varint()?,
            signature: r.array::<64>()?,
        };
        r.finish()?;
        Ok(t)
    }

    /// The ticket as text (lower-case hex), as `echo-node admit` prints it and configs take it.
    pub fn to_hex(&self) -> String {
        hex::encode(self.encode())
    }

    pub fn from_hex(text: &str) -> Result<Self> {
        let bytes = hex::decode(text.trim())
            .map_err(|e| StorageError::decode("admission ticket", e.to_string()))?;
        Self::decode(&bytes)
    }

    /// Whether this ticket admits `peer_id` into `swarm_id` at `now_unix_s` under the
    /// learner's public key.
    pub fn check(
        &self,
        learner: &[u8; 32],
        swarm_id: &str,
        peer_id: &str,
        now_unix_s: u64,
    ) -> std::result::Result<(), TicketError> {
        if self.swarm_id != swarm_id {
            return Err(TicketError::OtherSwarm(self.swarm_id.clone()));
        }
        if self.peer_id != peer_id {
            return Err(TicketError::OtherPeer(self.peer_id.clone()));
        }
        if now_unix_s >= self.expires_unix_s {
            return Err(TicketError::Expired {
                expired: self.expires_unix_s,
                now: now_unix_s,
            });
        }
        let learner = VerifyingKey::from_bytes(learner).map_err(|_| TicketError::BadSignature)?;
        learner
            .verify_strict(
                &self.signing_message(),
                &Signature::from_bytes(&self.signature),
            )
            .map_err(|_| TicketError::BadSignature)
    }
}

/// The proof-of-work hash of `nonce` for `peer_id` in `swarm_id`.
pub fn work_hash(swarm_id: &str, peer_id: &str, nonce: u64) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(WORK_CONTEXT);
    h.update(&(swarm_id.len() as u64).to_le_bytes());
    h.update(swarm_id.as_bytes());
    h.update(&(peer_id.len() as u64).to_le_bytes());
    h.update(peer_id.as_bytes());
    h.update(&nonce.to_le_bytes());
    *h.finalize().as_bytes()
}

/// Leading zero bits of `hash`.
pub fn leading_zero_bits(hash: &[u8; 32]) -> u32 {
    let mut n = 0;
    for b in hash {
        if *b == 0 {
            n += 8;
        } else {
            return n + b.leading_zeros();
        }
    }
    n
}

/// Whether `nonce` is a proof of `bits` of work for `peer_id` in `swarm_id`.
pub fn check_work(swarm_id: &str, peer_id: &str, nonce: u64, bits: u32) -> bool {
    bits == 0 || leading_zero_bits(&work_hash(swarm_id, peer_id, nonce)) >= bits
}

/// The first nonce from `start` that proves `bits` of work (about `2^bits` hashes; one
/// BLAKE3 of this size takes well under a microsecond per core). `None` if none below
/// `u64::MAX` does (not for any `bits` ≤ 64 in practice).
pub fn solve_work(swarm_id: &str, peer_id: &str, bits: u32, start: u64) -> Option<u64> {
    (start..u64::MAX).find(|&n| check_work(swarm_id, peer_id, n, bits))
}

/// What a worker presents: a ticket, a proof of work, or both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credential {
    pub ticket: Option<Ticket>,
    pub work_nonce: Option<u64>,
}

impl Credential {
    pub fn is_empty(&self) -> bool {
        self.ticket.is_none() && self.work_nonce.is_none()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(200);
        w.raw(b"EAC");
        w.u8(ADMISSION_FORMAT);
        match &self.ticket {
            None => w.u8(0),
            Some(t) => {
                w.u8(1);
                w.bytes(&t.encode());
            }
        }
        match self.work_nonce {
            None => w.u8(0),
            Some(n) => {
                w.u8(1);
                w.varint(n);
            }
        }
        w.into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        if bytes.len() > MAX_CREDENTIAL_BYTES {
            return Err(StorageError::decode(
                "admission credential",
                format!("{} bytes > {MAX_CREDENTIAL_BYTES}", bytes.len()),
            ));
        }
        let mut r = Reader::new(bytes, "admission credential");
        if r.raw(3)? != b"EAC" {
            return Err(r.err("bad magic"));
        }
        let format = r.u8()?;
        if format != ADMISSION_FORMAT {
            return Err(r.err(format!(
                "format {format} (this build reads {ADMISSION_FORMAT})"
            )));
        }
        let ticket = match r.u8()? {
            0 => None,
            1 => Some(Ticket::decode(r.bytes(MAX_CREDENTIAL_BYTES, "ticket")?)?),
            b => return Err(r.err(format!("ticket presence byte {b}"))),
        };
        let work_nonce = match r.u8()? {
            0 => None,
            1 => Some(r.varint()?),
            b => return Err(r.err(format!("work presence byte {b}"))),
        };
        r.finish()?;
        Ok(Credential { ticket, work_nonce })
    }

    /// Hex, as carried in a heartbeat's `admission` field.
    pub fn to_hex(&self) -> String {
        hex::encode(self.encode())
    }

    pub fn from_hex(text: &str) -> Result<Self> {
        if text.len() > 2 * MAX_CREDENTIAL_BYTES {
            return Err(StorageError::decode(
                "admission credential",
                "longer than the limit",
            ));
        }
        let bytes = hex::decode(text)
            .map_err(|e| StorageError::decode("admission credential", e.to_string()))?;
        Self::decode(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeKey;

    #[test]
    fn a_ticket_admits_its_peer_until_it_expires_and_nobody_else() {
        let learner = NodeKey::generate();
        let t = Ticket::issue(learner.signing_key(), "s", "12D3peer", 1000, 2).unwrap();
        assert_eq!(t.expires_unix_s, 1000 + 7200);
        let pk = learner.verifying_key().to_bytes();
        assert_eq!(t.check(&pk, "s", "12D3peer", 1000), Ok(()));
        assert_eq!(t.check(&pk, "s", "12D3peer", 8199), Ok(()));
        assert!(matches!(
            t.check(&pk, "s", "12D3peer", 8200),
            Err(TicketError::Expired { .. })
        ));
        assert!(matches!(
            t.check(&pk, "s", "12D3other", 1000),
            Err(TicketError::OtherPeer(_))
        ));
        assert!(matches!(
            t.check(&pk, "t", "12D3peer", 1000),
            Err(TicketError::OtherSwarm(_))
        ));
        let other = NodeKey::generate().verifying_key().to_bytes();
        assert_eq!(
            t.check(&other, "s", "12D3peer", 1000),
            Err(TicketError::BadSignature)
        );
        // Round trip, and a ticket altered after signing (a longer expiry) fails.
        let back = Ticket::from_hex(&t.to_hex()).unwrap();
        assert_eq!(back, t);
        let mut forged = t.clone();
        forged.expires_unix_s += 3600;
        assert_eq!(
            forged.check(&pk, "s", "12D3peer", 1000),
            Err(TicketError::BadSignature)
        );
    }

    #[test]
    fn work_is_bound_to_peer_and_swarm() {
        let nonce = solve_work("s", "12D3peer", 12, 0).unwrap();
        assert!(check_work("s", "12D3peer", nonce, 12));
        assert!(leading_zero_bits(&work_hash("s", "12D3peer", nonce)) >= 12);
        assert!(
            !(0..nonce).any(|n| check_work("s", "12D3peer", n, 12)),
            "the first"
        );
        // The same nonce proves nothing for another peer or swarm (deterministic: these
        // hashes are fixed); 0 bits is no work at all.
        assert!(!check_work("s", "12D3other", nonce, 12));
        assert!(!check_work("s2", "12D3peer", nonce, 12));
        assert!(check_work("x", "y", 0, 0));
        assert_eq!(leading_zero_bits(&[0; 32]), 256);
        let mut h = [0u8; 32];
        h[1] = 0b0001_0000;
        assert_eq!(leading_zero_bits(&h), 11);
    }

    #[test]
    fn credentials_round_trip_and_garbage_is_an_error() {
        let learner = NodeKey::generate();
        let t = Ticket::issue(learner.signing_key(), "s", "p", 1, 1).unwrap();
        for c in [
            Credential::default(),
            Credential {
                ticket: Some(t.clone()),
                work_nonce: None,
            },
            Credential {
                ticket: Some(t),
                work_nonce: Some(u64::MAX),
            },
        ] {
            assert_eq!(Credential::from_hex(&c.to_hex()).unwrap(), c);
        }
        assert!(Credential::from_hex("zz").is_err());
        assert!(Credential::from_hex("").is_err());
        assert!(Credential::from_hex(&"00".repeat(MAX_CREDENTIAL_BYTES + 1)).is_err());
        let mut bytes = Credential::default().encode();
        bytes.push(0);
        assert!(Credential::decode(&bytes).is_err(), "trailing bytes");
        assert!(Ticket::from_hex("45544b02").is_err(), "another format");
    }
}
