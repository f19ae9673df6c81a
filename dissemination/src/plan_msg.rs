//! The signed chain-plan message (`docs/broadcast.md`, ECHO-2's forwarding chains): which
//! workers receive snapshot `version` from whom, signed by the swarm's learner.
//!
//! Owns: the plan's canonical encoding, its signature and the acceptance rule, and the peer-id
//! field shared with the activation order ([`put_peer`], [`read_peer`]). Must not touch: how a
//! plan is computed (`control::plan`) or the network.
//!
//! Encoding (format 2, `storage::codec`: varints, varint-length-prefixed bytes/strings; byte
//! layout in `docs/protocol.md`): magic `b"ECP"`, format `2`, swarm id (string ≤ 65 535 B),
//! snapshot version (varint), plan sequence (varint), created (varint unix ms), learner public
//! key (32 B), chain count (varint) and for each chain its length (varint ≥ 1) and peer ids
//! (bytes, 1–64 B: the multihash), fetch-only count (varint) + peer ids; a signed plan is that
//! encoding followed by the 64-byte ed25519 signature over it. Limits: ≤ [`MAX_PLAN_BYTES`]
//! bytes, ≤ [`MAX_PLAN_PEERS`] peers in all, no peer twice. (Format 1 used big-endian
//! fixed-width integers.)
//!
//! Acceptance: a plan is accepted only when it names the configured learner key, the
//! signature verifies, the swarm id matches, and `(version, seq)` is lexicographically greater
//! than the last accepted plan's — a re-signed (repaired) plan for the same snapshot bumps
//! `seq`; anything not moving forward is a replay and is ignored.

use control::plan::ChainPlan;
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use p2p::PeerId;
use storage::codec::{Reader, Writer};

use crate::error::{DisseminationError, Result};

pub const PLAN_MAGIC: &[u8; 3] = b"ECP";
pub const PLAN_FORMAT: u8 = 2;
/// Largest encoded signed plan (fits a gossip message).
pub const MAX_PLAN_BYTES: usize = 512 * 1024;
/// Most peers a plan may name.
pub const MAX_PLAN_PEERS: usize = 8192;

/// A chain plan for one snapshot version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanMessage {
    pub swarm_id: String,
    pub version: u64,
    pub seq: u64,
    pub created_unix_ms: u64,
    pub learner_key: [u8; 32],
    /// `chains[j][0]` receives from the learner, `chains[j][k+1]` from `chains[j][k]`.
    pub chains: Vec<Vec<PeerId>>,
    /// Workers that do not forward and fetch chunks from any holder.
    pub fetch_only: Vec<PeerId>,
}

/// A plan with the learner's signature over its canonical encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedPlan {
    pub plan: PlanMessage,
    pub signature: [u8; 64],
}

/// Longest swarm id a signed plan or order may carry.
pub const MAX_SWARM_ID_BYTES: usize = u16::MAX as usize;
/// Longest peer id (multihash bytes) a signed plan or order may carry.
pub const MAX_PEER_ID_BYTES: usize = 64;

/// A peer id field: its multihash bytes behind a varint length.
pub(crate) fn put_peer(w: &mut Writer, p: &PeerId) {
    w.bytes(&p.to_bytes());
}

/// Reads a peer id field (1–[`MAX_PEER_ID_BYTES`] bytes).
pub(crate) fn read_peer(r: &mut Reader<'_>, what: &'static str) -> Result<PeerId> {
    let b = r
        .bytes(MAX_PEER_ID_BYTES, "peer id")
        .map_err(DisseminationError::codec)?;
    if b.is_empty() {
        return Err(DisseminationError::decode(what, "empty peer id"));
    }
    PeerId::from_bytes(b).map_err(|e| DisseminationError::decode(what, format!("peer id: {e}")))
}

/// Reads a count that, added to the `total` peers read so far, stays ≤ `max`.
pub(crate) fn read_count(
    r: &mut Reader<'_>,
    what: &'static str,
    total: &mut usize,
    max: usize,
) -> Result<usize> {
    let n = r.varint().map_err(DisseminationError::codec)?;
    if n > (max - *total) as u64 {
        return Err(DisseminationError::decode(what, "too many peers"));
    }
    *total += n as usize;
    Ok(n as usize)
}

impl PlanMessage {
    pub fn from_plan(
        swarm_id: &str,
        version: u64,
        seq: u64,
        learner_key: &VerifyingKey,
        plan: &ChainPlan<PeerId>,
    ) -> Self {
        PlanMessage {
            swarm_id: swarm_id.to_string(),
            version,
            seq,
            created_unix_ms: storage::unix_ms(),
            learner_key: learner_key.to_bytes(),
            chains: plan.chains.clone(),
            fetch_only: plan.fetch_only.clone(),
        }
    }

    pub fn to_plan(&self) -> ChainPlan<PeerId> {
        ChainPlan {
            chains: self.chains.clone(),
            fetch_only: self.fetch_only.clone(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let peers = self.chains.iter().map(Vec::len).sum::<usize>() + self.fetch_only.len();
        let mut w = Writer::with_capacity(128 + 40 * peers);
        w.raw(PLAN_MAGIC);
        w.u8(PLAN_FORMAT);
        w.str(&self.swarm_id);
        w.varint(self.version);
        w.varint(self.seq);
        w.varint(self.created_unix_ms);
        w.raw(&self.learner_key);
        w.varint(self.chains.len() as u64);
        for c in &self.chains {
            w.varint(c.len() as u64);
            for p in c {
                put_peer(&mut w, p);
            }
        }
        w.varint(self.fetch_only.len() as u64);
        for p in &self.fetch_only {
            put_peer(&mut w, p);
        }
        w.into_bytes()
    }

    /// Signs with the learner key the plan names.
    pub fn sign(self, key: &SigningKey) -> Result<SignedPlan> {
        if key.verifying_key().to_bytes() != self.learner_key {
            return Err(DisseminationError::BadSignature(
                "signing key does not match the plan's learner key".into(),
            ));
        }
        let signature = key.sign(&self.encode()).to_bytes();
        Ok(SignedPlan {
            plan: self,
            signature,
        })
    }
}

impl SignedPlan {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = self.plan.encode();
        b.extend_from_slice(&self.signature);
        b
    }

    /// Decodes (with limits) without verifying the signature.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        if bytes.len() > MAX_PLAN_BYTES {
            return Err(DisseminationError::decode(
                "plan",
                format!("{} bytes > limit {MAX_PLAN_BYTES}", bytes.len()),
            ));
        }
        const WHAT: &str = "plan";
        let mut r = Reader::new(bytes, WHAT);
        if r.raw(3).map_err(DisseminationError::codec)? != PLAN_MAGIC {
            return Err(DisseminationError::decode(WHAT, "bad magic"));
        }
        let format = r.u8().map_err(DisseminationError::codec)?;
        if format != PLAN_FORMAT {
            return Err(DisseminationError::decode(
                WHAT,
                format!("format {format} (this node speaks {PLAN_FORMAT})"),
            ));
        }
        let swarm_id = r
            .string(MAX_SWARM_ID_BYTES, "swarm id")
            .map_err(DisseminationError::codec)?;
        let version = r.varint().map_err(DisseminationError::codec)?;
        let seq = r.varint().map_err(DisseminationError::codec)?;
        let created_unix_ms = r.varint().map_err(DisseminationError::codec)?;
        let learner_key = r.array::<32>().map_err(DisseminationError::codec)?;
        let mut total = 0usize;
        // Every chain takes at least 3 bytes (its length and a peer id's length and first
        // byte): a count the remaining bytes cannot hold is refused before room is reserved.
        let n_chains = r
            .len(MAX_PLAN_PEERS, 3, "chain count")
            .map_err(DisseminationError::codec)?;
        let mut chains = Vec::with_capacity(n_chains);
        for _ in 0..n_chains {
            let len = read_count(&mut r, WHAT, &mut total, MAX_PLAN_PEERS)?;
            if len == 0 {
                return Err(DisseminationError::decode(WHAT, "empty chain"));
            }
            chains.push(
                (0..len)
                    .map(|_| read_peer(&mut r, WHAT))
                    .collect::<Result<Vec<_>>>()?,
            );
        }
        let n_fetch = read_count(&mut r, WHAT, &mut total, MAX_PLAN_PEERS)?;
        let fetch_only = (0..n_fetch)
            .map(|_| read_peer(&mut r, WHAT))
            .collect::<Result<Vec<_>>>()?;
        let signature = r.array::<64>().map_err(DisseminationError::codec)?;
        if r.remaining() != 0 {
            return Err(DisseminationError::decode(WHAT, "trailing bytes"));
        }
        let mut seen = std::collections::HashSet::new();
        if !chains
            .iter()
            .flatten()
            .chain(&fetch_only)
            .all(|p| seen.insert(*p))
        {
            return Err(DisseminationError::decode("plan", "a peer appears twice"));
        }
        Ok(SignedPlan {
            plan: PlanMessage {
                swarm_id,
                version,
                seq,
                created_unix_ms,
                learner_key,
                chains,
                fetch_only,
            },
            signature,
        })
    }

    /// Accepts the plan only if it names `authority` and the signature verifies under it.
    pub fn verify(&self, authority: &VerifyingKey) -> Result<&PlanMessage> {
        if self.plan.learner_key != authority.to_bytes() {
            return Err(DisseminationError::BadSignature(format!(
                "plan v{}#{} is signed by {}, not by the swarm's learner",
                self.plan.version,
                self.plan.seq,
                hex::encode(self.plan.learner_key)
            )));
        }
        authority
            .verify(&self.plan.encode(), &Signature::from_bytes(&self.signature))
            .map_err(|_| {
                DisseminationError::BadSignature(format!(
                    "plan v{}#{}: signature does not verify",
                    self.plan.version, self.plan.seq
                ))
            })?;
        Ok(&self.plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(n: u8) -> Vec<PeerId> {
        (1..=n).map(|i| p2p::peer_id_from_seed([i; 32])).collect()
    }

    fn plan(key: &SigningKey, seq: u64) -> PlanMessage {
        let p = peers(5);
        PlanMessage {
            swarm_id: "s".into(),
            version: 3,
            seq,
            created_unix_ms: 1,
            learner_key: key.verifying_key().to_bytes(),
            chains: vec![vec![p[0], p[1]], vec![p[2]]],
            fetch_only: vec![p[3], p[4]],
        }
    }

    #[test]
    fn round_trip_and_verify() {
        let k = SigningKey::from_bytes(&[7; 32]);
        let s = plan(&k, 2).sign(&k).unwrap();
        let d = SignedPlan::decode(&s.encode()).unwrap();
        assert_eq!(d, s);
        assert!(d.verify(&k.verifying_key()).is_ok());
        let other = SigningKey::from_bytes(&[8; 32]);
        assert!(d.verify(&other.verifying_key()).is_err());
        assert!(plan(&k, 2).sign(&other).is_err());
    }

    #[test]
    fn tampering_and_garbage_are_refused() {
        let k = SigningKey::from_bytes(&[7; 32]);
        let mut s = plan(&k, 2).sign(&k).unwrap();
        s.plan.seq = 3;
        assert!(s.verify(&k.verifying_key()).is_err());
        let enc = plan(&k, 2).sign(&k).unwrap().encode();
        for cut in [0, 3, 10, enc.len() - 1] {
            assert!(SignedPlan::decode(&enc[..cut]).is_err());
        }
        // A chain count the message cannot hold (found by the decoder property
        // `a_chain_count_beyond_the_bytes_left_is_refused_before_allocating`): refused from
        // the count alone, not after reserving room for 8192 chains.
        let mut few = plan(&k, 2).sign(&k).unwrap().encode();
        let at = 4 + 2 + 1 + 1 + 1 + 32;
        assert_eq!(few[at], 2, "the chain count");
        few[at] = 0x80;
        few.insert(at + 1, 0x40); // 8192 chains
        let err = SignedPlan::decode(&few).unwrap_err().to_string();
        assert!(err.contains("bytes left"), "{err}");
        let mut dup = plan(&k, 2);
        dup.fetch_only.push(dup.chains[0][0]);
        let enc = dup.sign(&k).unwrap().encode();
        assert!(SignedPlan::decode(&enc).is_err());
        assert!(SignedPlan::decode(&vec![0u8; MAX_PLAN_BYTES + 1]).is_err());
    }
}
