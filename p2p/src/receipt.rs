//! Delivery receipts (`docs/protocol.md`, "Delivery receipt"): what a chain child says its
//! planned parent delivered of one snapshot version, signed with the child's node key and
//! carried in its heartbeats ([`crate::Heartbeat::receipts`]).
//!
//! Why signed although gossip is authenticated: a receipt is evidence against the parent it
//! names. Signed by the child's own key over a domain-separated encoding that names the swarm,
//! it stays the child's statement wherever it travels (a learner can log it, show it, or hand
//! it on), and a relaying peer cannot alter it.
//!
//! Owns: the receipt's fields, its bounds, its signing bytes, signing and verification. Must
//! not touch: what the learner concludes from it (`control::forwarding`), when a child issues
//! one (`dissemination`).

use libp2p::PeerId;
use serde::{Deserialize, Serialize};

use crate::error::MessageError;

/// Version of the delivery receipt. A receipt of another version is skipped, not refused, so
/// that a newer receipt does not make an older learner reject the heartbeat carrying it.
pub const RECEIPT_VERSION: u32 = 1;

/// Most receipts in one heartbeat (the newest ones; each ≈ 330 bytes of JSON, so three keep
/// the largest heartbeat under its bound).
pub const MAX_HEARTBEAT_RECEIPTS: usize = 3;

/// Times past this (ms) are not plausible for one version's transfer (a day).
const MAX_MS: u64 = 86_400_000;

/// Domain separation of the signing bytes.
const DOMAIN: &[u8] = b"echo-swarm/delivery-receipt/v1";

/// What a child received from its planned parent for one version. Times are the child's, in
/// ms after it accepted the version's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryReceipt {
    /// Receipt version ([`RECEIPT_VERSION`]).
    pub v: u32,
    /// The snapshot version.
    pub version: u64,
    /// The parent the plan named for this version (peer id).
    pub parent: String,
    /// Bytes the child lacked when the parent's push began (when it accepted the manifest, if
    /// no push began): what the parent had to send.
    pub wanted: u64,
    /// Verified chunk bytes received on the parent's push ("nothing" is 0).
    pub bytes: u64,
    /// A hello from the parent for this version or a newer one arrived before the receipt.
    pub spoke: bool,
    /// The parent's hello for this version ("nothing": absent), first and last chunk from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hello_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_ms: Option<u64>,
    /// When the child stopped needing the version's bytes (installed it, or gave it up for a
    /// newer one), or when it issued the receipt if neither.
    pub end_ms: u64,
    /// The child installed the version.
    pub installed: bool,
    /// ed25519 signature by the child's node key over [`DeliveryReceipt::signing_bytes`],
    /// lower-case hex (empty before signing).
    pub sig: String,
}

impl DeliveryReceipt {
    /// The signed bytes: the domain, the swarm id, then every field but the signature in a
    /// fixed little-endian layout.
    pub fn signing_bytes(&self, swarm_id: &str) -> Vec<u8> {
        let mut b = Vec::with_capacity(160);
        b.extend_from_slice(DOMAIN);
        for s in [swarm_id, &self.parent] {
            b.extend_from_slice(&(s.len() as u32).to_le_bytes());
            b.extend_from_slice(s.as_bytes());
        }
        b.extend_from_slice(&self.v.to_le_bytes());
        for n in [self.version, self.wanted, self.bytes, self.end_ms] {
            b.extend_from_slice(&n.to_le_bytes());
        }
        for t in [self.hello_ms, self.first_ms, self.last_ms] {
            b.push(u8::from(t.is_some()));
            b.extend_from_slice(&t.unwrap_or(0).to_le_bytes());
        }
        b.extend([u8::from(self.spoke), u8::from(self.installed)]);
        b
    }

    /// Signs with the node key of seed `seed` (`storage::NodeKey::seed`).
    pub fn sign(mut self, seed: [u8; 32], swarm_id: &str) -> Self {
        let mut seed = seed;
        let key = libp2p::identity::Keypair::ed25519_from_bytes(&mut seed)
            .expect("32 bytes are a valid ed25519 seed");
        let sig = key
            .sign(&self.signing_bytes(swarm_id))
            .expect("ed25519 signing does not fail");
        self.sig = hex::encode(sig);
        self
    }

    /// Whether `signer` (the child: the heartbeat's sender) signed this receipt for `swarm_id`.
    /// Only ed25519 peer ids (which embed their public key) can.
    pub fn verify(&self, signer: &PeerId, swarm_id: &str) -> bool {
        let Ok(sig) = hex::decode(&self.sig) else {
            return false;
        };
        let mh = signer.as_ref();
        if mh.code() != 0 {
            return false;
        }
        libp2p::identity::PublicKey::try_decode_protobuf(mh.digest())
            .is_ok_and(|k| k.verify(&self.signing_bytes(swarm_id), &sig))
    }

    /// The parent's peer id.
    pub fn parent_id(&self) -> Option<PeerId> {
        self.parent.parse().ok()
    }

    /// Bounds checked when a heartbeat is decoded (the signature is checked only by the
    /// learner, the one reader that acts on receipts).
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        if self.parent_id().is_none() {
            return Err(MessageError::Invalid(format!(
                "receipt parent `{}` is not a peer id",
                self.parent.chars().take(64).collect::<String>()
            )));
        }
        if self.sig.len() != 128 || !self.sig.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(MessageError::Invalid(
                "receipt signature is not 64 bytes of hex".into(),
            ));
        }
        let times = [
            self.hello_ms,
            self.first_ms,
            self.last_ms,
            Some(self.end_ms),
        ];
        if times.iter().flatten().any(|&t| t > MAX_MS) {
            return Err(MessageError::Invalid("receipt time beyond a day".into()));
        }
        if self.bytes > self.wanted.max(1) << 1 {
            return Err(MessageError::Invalid(
                "receipt bytes far beyond what was wanted".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt() -> DeliveryReceipt {
        DeliveryReceipt {
            v: RECEIPT_VERSION,
            version: 7,
            parent: crate::peer_id_from_seed([2; 32]).to_string(),
            wanted: 1 << 20,
            bytes: 1 << 19,
            spoke: true,
            hello_ms: Some(3),
            first_ms: Some(12),
            last_ms: Some(80),
            end_ms: 95,
            installed: true,
            sig: String::new(),
        }
    }

    #[test]
    fn a_signed_receipt_verifies_only_for_its_signer_swarm_and_content() {
        let child = crate::peer_id_from_seed([1; 32]);
        let r = receipt().sign([1; 32], "s");
        r.check().unwrap();
        assert!(r.verify(&child, "s"));
        assert!(!r.verify(&crate::peer_id_from_seed([3; 32]), "s"), "signer");
        assert!(!r.verify(&child, "t"), "swarm");
        for tampered in [
            DeliveryReceipt {
                bytes: 0,
                ..r.clone()
            },
            DeliveryReceipt {
                hello_ms: None,
                ..r.clone()
            },
            DeliveryReceipt {
                first_ms: None,
                ..r.clone()
            },
            DeliveryReceipt {
                parent: crate::peer_id_from_seed([4; 32]).to_string(),
                ..r.clone()
            },
        ] {
            assert!(!tampered.verify(&child, "s"), "{tampered:?}");
        }
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.len() < 400, "{}", json.len());
        let back: DeliveryReceipt = serde_json::from_str(&json).unwrap();
        assert!(back.verify(&child, "s"));
    }

    #[test]
    fn implausible_receipts_are_refused_at_decode() {
        let ok = receipt().sign([1; 32], "s");
        for bad in [
            DeliveryReceipt {
                parent: "nobody".into(),
                ..ok.clone()
            },
            DeliveryReceipt {
                sig: "00".into(),
                ..ok.clone()
            },
            DeliveryReceipt {
                end_ms: MAX_MS + 1,
                ..ok.clone()
            },
            DeliveryReceipt {
                bytes: 10 << 20,
                ..ok.clone()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
