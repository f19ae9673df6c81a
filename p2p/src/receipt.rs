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

/// Version of the delivery receipt. A receipt of another version is skipped, not refused, so
/// that a newer receipt does not make an older learner reject the heartbeat carrying it.
/// 2: `duplicates` (the parent's chunks the child had not asked for or already had from it)
/// is signed, and `bytes` counts each asked chunk once, so it never exceeds `wanted`.
pub const RECEIPT_VERSION: u32 = 2;

/// Most receipts in one heartbeat (the newest ones; each ≈ 330 bytes of JSON, so three keep
/// the largest heartbeat under its bound).
pub const MAX_HEARTBEAT_RECEIPTS: usize = 3;

/// Times past this (ms) are not plausible for one version's transfer (a day).
const MAX_MS: u64 = 86_400_000;

/// Domain separation of the signing bytes.
const DOMAIN: &[u8] = b"echo-swarm/delivery-receipt/v2";

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
    /// Bytes of the first verified copy of each chunk the child asked the parent for
    /// ("nothing" is 0): at most `wanted`, whatever the parent sends.
    pub bytes: u64,
    /// Bytes of chunks the parent pushed that the child had not asked for, or had already
    /// received from it: a protocol error of the parent's (the child charges it and drops the
    /// stream at the first one).
    #[serde(default)]
    pub duplicates: u64,
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
        for n in [
            self.version,
            self.wanted,
            self.bytes,
            self.duplicates,
            self.end_ms,
        ] {
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

    /// Why a receipt cannot be read at all, checked when a heartbeat is decoded: such a
    /// receipt is dropped with a log line, never a reason to refuse the heartbeat carrying it
    /// (`Heartbeat::decode`) — a receipt reports counts the parent controls, and no count a
    /// peer controls may make its child's message invalid. What is merely out of range is not
    /// a defect here: the reader clamps it ([`DeliveryReceipt::clamped`]). The signature is
    /// checked only by the learner, the one reader that acts on receipts.
    pub fn defect(&self) -> Option<&'static str> {
        if self.parent_id().is_none() {
            return Some("the parent is not a peer id");
        }
        if self.sig.len() != 128 || !self.sig.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Some("the signature is not 64 bytes of hex");
        }
        None
    }

    /// The receipt as the learner reads it once its signature is verified: every count within
    /// its range — `bytes` at most `wanted`, times at most a day (a later time is read as a
    /// day), `first_ms` ≤ `last_ms` — so no value, however a parent inflated what its child
    /// saw, reaches the verdict out of range. The signed receipt itself is left as it is.
    pub fn clamped(&self) -> DeliveryReceipt {
        let t = |x: u64| x.min(MAX_MS);
        let first_ms = self.first_ms.map(t);
        DeliveryReceipt {
            bytes: self.bytes.min(self.wanted),
            hello_ms: self.hello_ms.map(t),
            first_ms,
            last_ms: self.last_ms.map(t).map(|l| l.max(first_ms.unwrap_or(0))),
            end_ms: t(self.end_ms),
            ..self.clone()
        }
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
            duplicates: 0,
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
        assert_eq!(r.defect(), None);
        assert!(r.verify(&child, "s"));
        assert!(!r.verify(&crate::peer_id_from_seed([3; 32]), "s"), "signer");
        assert!(!r.verify(&child, "t"), "swarm");
        for tampered in [
            DeliveryReceipt {
                bytes: 0,
                ..r.clone()
            },
            DeliveryReceipt {
                duplicates: 1,
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
    fn unreadable_receipts_have_a_defect_and_out_of_range_ones_are_clamped() {
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
        ] {
            assert!(bad.defect().is_some(), "{bad:?}");
        }
        // Counts a parent controls are never a defect: a parent that pushed every chunk three
        // times, or times past a day, are read clamped.
        let inflated = DeliveryReceipt {
            bytes: 10 << 20,
            duplicates: 20 << 20,
            end_ms: MAX_MS + 1,
            first_ms: Some(MAX_MS + 5),
            last_ms: Some(12),
            ..ok.clone()
        };
        assert_eq!(inflated.defect(), None);
        let c = inflated.clamped();
        assert_eq!((c.bytes, c.duplicates), (1 << 20, 20 << 20));
        assert_eq!(
            (c.end_ms, c.first_ms, c.last_ms),
            (MAX_MS, Some(MAX_MS), Some(MAX_MS))
        );
        assert_eq!(ok.clamped(), ok, "an in-range receipt reads as it is");
    }
}
