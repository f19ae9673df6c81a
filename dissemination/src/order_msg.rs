//! The signed activation order (ECHO-2's scheduler, `docs/protocol.md`): which rollout
//! workers the learner's scheduler keeps generating (active) and which it keeps connected but
//! idle (standby). Gossiped on the Plans topic next to chain plans, signed by the swarm's
//! learner.
//!
//! Owns: the order's canonical encoding, its signature and acceptance rule. Must not touch:
//! how the scheduler decides (`control`), the network.
//!
//! Encoding (format 2, `storage::codec`; byte layout in `docs/protocol.md`): magic `b"ECA"`,
//! format `2`, swarm id (string ≤ 65 535 B), sequence (varint), created (varint unix ms),
//! learner public key (32 B), active count (varint) and peer ids (bytes, 1–64 B), standby count
//! (varint) and peer ids, then the 64-byte ed25519 signature over everything before it.
//! Limits: ≤ [`MAX_ORDER_PEERS`] peers, no peer twice. (Format 1 used big-endian fixed-width
//! integers.)
//!
//! Acceptance: the named key is the configured learner key, the signature verifies, the swarm
//! id matches and the sequence is greater than the last accepted order's (the learner uses
//! its clock in milliseconds, so a restarted learner's orders still move forward); anything
//! else is a replay and ignored.

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use p2p::PeerId;
use storage::codec::{Reader, Writer};

use crate::error::{DisseminationError, Result};
use crate::plan_msg::{put_peer, read_count, read_peer, MAX_SWARM_ID_BYTES};

pub const ORDER_MAGIC: &[u8; 3] = b"ECA";
pub const ORDER_FORMAT: u8 = 2;
/// Most peers an order may name.
pub const MAX_ORDER_PEERS: usize = 8192;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivationOrder {
    pub swarm_id: String,
    pub seq: u64,
    pub created_unix_ms: u64,
    pub learner_key: [u8; 32],
    pub active: Vec<PeerId>,
    pub standby: Vec<PeerId>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedOrder {
    pub order: ActivationOrder,
    pub signature: [u8; 64],
}

impl ActivationOrder {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(96 + 40 * (self.active.len() + self.standby.len()));
        w.raw(ORDER_MAGIC);
        w.u8(ORDER_FORMAT);
        w.str(&self.swarm_id);
        w.varint(self.seq);
        w.varint(self.created_unix_ms);
        w.raw(&self.learner_key);
        for list in [&self.active, &self.standby] {
            w.varint(list.len() as u64);
            for p in list {
                put_peer(&mut w, p);
            }
        }
        w.into_bytes()
    }

    /// Signs with the learner key the order names.
    pub fn sign(self, key: &SigningKey) -> Result<SignedOrder> {
        if key.verifying_key().to_bytes() != self.learner_key {
            return Err(DisseminationError::BadSignature(
                "signing key does not match the order's learner key".into(),
            ));
        }
        let signature = key.sign(&self.encode()).to_bytes();
        Ok(SignedOrder {
            order: self,
            signature,
        })
    }

    /// `Some(true)` active, `Some(false)` standby, `None` not named.
    pub fn state_of(&self, peer: &PeerId) -> Option<bool> {
        if self.active.contains(peer) {
            Some(true)
        } else if self.standby.contains(peer) {
            Some(false)
        } else {
            None
        }
    }
}

impl SignedOrder {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = self.order.encode();
        b.extend_from_slice(&self.signature);
        b
    }

    /// True when `bytes` carry this message kind (the Plans topic carries plans and orders).
    pub fn is_order(bytes: &[u8]) -> bool {
        bytes.starts_with(ORDER_MAGIC)
    }

    /// Decodes (with limits) without verifying the signature.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        const WHAT: &str = "activation order";
        let mut r = Reader::new(bytes, WHAT);
        if r.raw(3).map_err(DisseminationError::codec)? != ORDER_MAGIC {
            return Err(DisseminationError::decode(WHAT, "bad magic"));
        }
        let format = r.u8().map_err(DisseminationError::codec)?;
        if format != ORDER_FORMAT {
            return Err(DisseminationError::decode(
                WHAT,
                format!("format {format} (this node speaks {ORDER_FORMAT})"),
            ));
        }
        let swarm_id = r
            .string(MAX_SWARM_ID_BYTES, "swarm id")
            .map_err(DisseminationError::codec)?;
        let seq = r.varint().map_err(DisseminationError::codec)?;
        let created_unix_ms = r.varint().map_err(DisseminationError::codec)?;
        let learner_key = r.array::<32>().map_err(DisseminationError::codec)?;
        let mut lists = Vec::with_capacity(2);
        let mut total = 0usize;
        for _ in 0..2 {
            let n = read_count(&mut r, WHAT, &mut total, MAX_ORDER_PEERS)?;
            lists.push(
                (0..n)
                    .map(|_| read_peer(&mut r, WHAT))
                    .collect::<Result<Vec<_>>>()?,
            );
        }
        let signature = r.array::<64>().map_err(DisseminationError::codec)?;
        if r.remaining() != 0 {
            return Err(DisseminationError::decode(WHAT, "trailing bytes"));
        }
        let standby = lists.pop().unwrap_or_default();
        let active = lists.pop().unwrap_or_default();
        let mut seen = std::collections::HashSet::new();
        if !active.iter().chain(&standby).all(|p| seen.insert(*p)) {
            return Err(DisseminationError::decode(
                "activation order",
                "a peer appears twice",
            ));
        }
        Ok(SignedOrder {
            order: ActivationOrder {
                swarm_id,
                seq,
                created_unix_ms,
                learner_key,
                active,
                standby,
            },
            signature,
        })
    }

    /// Checks the signer and the signature.
    pub fn verify(&self, authority: &VerifyingKey) -> Result<&ActivationOrder> {
        if self.order.learner_key != authority.to_bytes() {
            return Err(DisseminationError::BadSignature(format!(
                "activation order #{} is not signed by the swarm's learner",
                self.order.seq
            )));
        }
        authority
            .verify(
                &self.order.encode(),
                &Signature::from_bytes(&self.signature),
            )
            .map_err(|_| {
                DisseminationError::BadSignature(format!(
                    "activation order #{}: signature does not verify",
                    self.order.seq
                ))
            })?;
        Ok(&self.order)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(n: u8) -> Vec<PeerId> {
        (0..n)
            .map(|i| {
                let k = SigningKey::from_bytes(&[i + 1; 32]);
                p2p::peer_id_from_public(k.verifying_key().to_bytes()).unwrap()
            })
            .collect()
    }

    fn order(key: &SigningKey, seq: u64) -> ActivationOrder {
        let p = peers(3);
        ActivationOrder {
            swarm_id: "s".into(),
            seq,
            created_unix_ms: 7,
            learner_key: key.verifying_key().to_bytes(),
            active: p[..2].to_vec(),
            standby: p[2..].to_vec(),
        }
    }

    #[test]
    fn round_trips_verifies_and_names_states() {
        let key = SigningKey::from_bytes(&[9; 32]);
        let signed = order(&key, 5).sign(&key).unwrap();
        let bytes = signed.encode();
        assert!(SignedOrder::is_order(&bytes));
        let back = SignedOrder::decode(&bytes).unwrap();
        assert_eq!(back, signed);
        back.verify(&key.verifying_key()).unwrap();
        let p = peers(4);
        assert_eq!(back.order.state_of(&p[0]), Some(true));
        assert_eq!(back.order.state_of(&p[2]), Some(false));
        assert_eq!(back.order.state_of(&p[3]), None);
    }

    #[test]
    fn forged_tampered_and_malformed_orders_are_refused() {
        let key = SigningKey::from_bytes(&[9; 32]);
        let other = SigningKey::from_bytes(&[8; 32]);
        // Signed by another key.
        let forged = order(&other, 5).sign(&other).unwrap();
        assert!(forged.verify(&key.verifying_key()).is_err());
        // A flipped bit in the body.
        let mut bytes = order(&key, 5).sign(&key).unwrap().encode();
        let i = bytes.len() - 70;
        bytes[i] ^= 1;
        let r = SignedOrder::decode(&bytes).map(|o| o.verify(&key.verifying_key()).is_ok());
        assert!(!matches!(r, Ok(true)));
        // Truncations never panic and never decode.
        let good = order(&key, 5).sign(&key).unwrap().encode();
        for n in 0..good.len() {
            assert!(SignedOrder::decode(&good[..n]).is_err());
        }
        // A peer in both lists.
        let mut o = order(&key, 5);
        o.standby.push(o.active[0]);
        assert!(SignedOrder::decode(&o.sign(&key).unwrap().encode()).is_err());
    }
}
