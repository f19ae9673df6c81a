//! The signed chain-plan message (SPEC §3, §6): which workers receive snapshot `version` from
//! whom, signed by the swarm's learner.
//!
//! Owns: the plan's canonical encoding, its signature and the acceptance rule. Must not touch:
//! how a plan is computed (`control::plan`) or the network.
//!
//! Encoding v1 (all integers big-endian): magic `b"ECP"`, format `1`, swarm id (u16 length +
//! UTF-8), snapshot version (u64), plan sequence (u64), created (u64 unix ms), learner public
//! key (32 B), chain count (u32) and for each chain its length (u32) and peer ids (u8 length +
//! multihash bytes), fetch-only count (u32) + peer ids; a signed plan is that encoding followed
//! by the 64-byte ed25519 signature over it. Limits: ≤ [`MAX_PLAN_BYTES`] bytes, ≤
//! [`MAX_PLAN_PEERS`] peers in all, ≤ 64 bytes per peer id.
//!
//! Acceptance: a plan is accepted only when it names the configured learner key, the
//! signature verifies, the swarm id matches, and `(version, seq)` is lexicographically greater
//! than the last accepted plan's — a re-signed (repaired) plan for the same snapshot bumps
//! `seq`; anything not moving forward is a replay and is ignored.

use control::plan::ChainPlan;
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use p2p::PeerId;

use crate::error::{DisseminationError, Result};

pub const PLAN_MAGIC: &[u8; 3] = b"ECP";
pub const PLAN_FORMAT: u8 = 1;
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

pub(crate) fn put_peer(out: &mut Vec<u8>, p: &PeerId) {
    let b = p.to_bytes();
    out.push(b.len() as u8);
    out.extend_from_slice(&b);
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
            created_unix_ms: storage::now_unix_ms(),
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
        let mut out =
            Vec::with_capacity(128 + 40 * self.chains.iter().map(Vec::len).sum::<usize>());
        out.extend_from_slice(PLAN_MAGIC);
        out.push(PLAN_FORMAT);
        out.extend_from_slice(&(self.swarm_id.len() as u16).to_be_bytes());
        out.extend_from_slice(self.swarm_id.as_bytes());
        out.extend_from_slice(&self.version.to_be_bytes());
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.created_unix_ms.to_be_bytes());
        out.extend_from_slice(&self.learner_key);
        out.extend_from_slice(&(self.chains.len() as u32).to_be_bytes());
        for c in &self.chains {
            out.extend_from_slice(&(c.len() as u32).to_be_bytes());
            for p in c {
                put_peer(&mut out, p);
            }
        }
        out.extend_from_slice(&(self.fetch_only.len() as u32).to_be_bytes());
        for p in &self.fetch_only {
            put_peer(&mut out, p);
        }
        out
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

/// Bounds-checked big-endian reader; errors name the message kind `what`.
pub(crate) struct Reader<'a> {
    pub(crate) b: &'a [u8],
    pub(crate) what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.b.len() < n {
            return Err(DisseminationError::decode(self.what, "truncated"));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4")))
    }
    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8")))
    }
    pub(crate) fn peer(&mut self) -> Result<PeerId> {
        let n = self.take(1)?[0] as usize;
        if n == 0 || n > 64 {
            return Err(DisseminationError::decode(
                self.what,
                format!("peer id of {n} bytes"),
            ));
        }
        PeerId::from_bytes(self.take(n)?)
            .map_err(|e| DisseminationError::decode(self.what, format!("peer id: {e}")))
    }

    /// Swarm id: u16 length + UTF-8.
    pub(crate) fn swarm_id(&mut self) -> Result<String> {
        let n = u16::from_be_bytes(self.take(2)?.try_into().expect("2")) as usize;
        Ok(std::str::from_utf8(self.take(n)?)
            .map_err(|_| DisseminationError::decode(self.what, "swarm id is not UTF-8"))?
            .to_string())
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
        let mut r = Reader {
            b: bytes,
            what: "plan",
        };
        if r.take(3)? != PLAN_MAGIC {
            return Err(DisseminationError::decode("plan", "bad magic"));
        }
        let format = r.take(1)?[0];
        if format != PLAN_FORMAT {
            return Err(DisseminationError::decode(
                "plan",
                format!("format {format} (this node speaks {PLAN_FORMAT})"),
            ));
        }
        let swarm_id = r.swarm_id()?;
        let version = r.u64()?;
        let seq = r.u64()?;
        let created_unix_ms = r.u64()?;
        let learner_key: [u8; 32] = r.take(32)?.try_into().expect("32");
        let mut total = 0usize;
        let n_chains = r.u32()? as usize;
        if n_chains > MAX_PLAN_PEERS {
            return Err(DisseminationError::decode("plan", "too many chains"));
        }
        let mut chains = Vec::with_capacity(n_chains);
        for _ in 0..n_chains {
            let len = r.u32()? as usize;
            total += len;
            if len == 0 || total > MAX_PLAN_PEERS {
                return Err(DisseminationError::decode(
                    "plan",
                    "empty chain or too many peers",
                ));
            }
            chains.push((0..len).map(|_| r.peer()).collect::<Result<Vec<_>>>()?);
        }
        let n_fetch = r.u32()? as usize;
        total += n_fetch;
        if total > MAX_PLAN_PEERS {
            return Err(DisseminationError::decode("plan", "too many peers"));
        }
        let fetch_only = (0..n_fetch).map(|_| r.peer()).collect::<Result<Vec<_>>>()?;
        let signature: [u8; 64] = r.take(64)?.try_into().expect("64");
        if !r.b.is_empty() {
            return Err(DisseminationError::decode("plan", "trailing bytes"));
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
        let mut dup = plan(&k, 2);
        dup.fetch_only.push(dup.chains[0][0]);
        let enc = dup.sign(&k).unwrap().encode();
        assert!(SignedPlan::decode(&enc).is_err());
        assert!(SignedPlan::decode(&vec![0u8; MAX_PLAN_BYTES + 1]).is_err());
    }
}
