//! The in-process measurement behind the heartbeat-rate rule of [`crate::membership`]: what
//! one received heartbeat costs a node (ignored by default; run with
//! `cargo test -p p2p heartbeat_receive_cost -- --ignored --nocapture`).
//!
//! Per heartbeat a node pays, for *each copy* gossipsub delivers (one per mesh peer that
//! forwards it; gossipsub's codec checks the signature before duplicate suppression): the
//! author's public key from its peer id and an ed25519 verification over the signed
//! protobuf; and once: `Heartbeat::decode`, the rate limit and the peer-table update.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use libp2p::identity::{Keypair, PublicKey};
use libp2p::PeerId;

use crate::membership::{heartbeat_interval, TARGET_HEARTBEATS_PER_S};
use crate::messages::{Heartbeat, HEARTBEAT_VERSION};
use crate::peers::PeerEntry;
use crate::role::Role;

/// Copies of each message a node receives: gossipsub's default mesh degree `D` (this swarm
/// does not change it), an upper estimate (a node does not get a copy back on the link it
/// forwarded on first); `testnet membership` measured 4.4–4.8 with 32 real nodes.
const COPIES_PER_MESSAGE: f64 = 6.0;

/// A signed heartbeat as gossipsub carries it: author, signed bytes, signature, payload.
type Signed = (PeerId, Vec<u8>, Vec<u8>, Vec<u8>);

fn heartbeat(seq: u64) -> Heartbeat {
    Heartbeat {
        v: HEARTBEAT_VERSION,
        swarm_id: "membership-cost".into(),
        role: Role::Rollout,
        node_version: "0.1.0".into(),
        installed_version: Some(12),
        mu: 1.25,
        cost_per_hour: 0.4,
        availability: 1.0,
        pending: 3,
        forward_rate_bps: 12_345_678.0,
        receive_rate_bps: 23_456_789.0,
        started_unix_ms: 1_700_000_000_000,
        sent_unix_ms: 1_700_000_000_000 + seq,
        seq,
        device: None,
        reachability: None,
        addrs: Vec::new(),
        receipts: Vec::new(),
        admission: None,
        install_age_ms: None,
    }
}

#[test]
#[ignore = "a measurement, not a check; run it with --ignored --nocapture"]
fn heartbeat_receive_cost() {
    const K: u32 = 2000;
    const N: usize = 1000;
    let keys: Vec<Keypair> = (0..64).map(|_| Keypair::generate_ed25519()).collect();
    // The signed bytes of a gossipsub message: prefix, author, payload, sequence number and
    // topic (the protobuf framing adds a few bytes, not measurable here).
    let signed: Vec<Signed> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let peer = k.public().to_peer_id();
            let data = heartbeat(i as u64).encode();
            let mut msg = b"libp2p-pubsub:".to_vec();
            msg.extend_from_slice(&peer.to_bytes());
            msg.extend_from_slice(&data);
            msg.extend_from_slice(&(i as u64).to_be_bytes());
            msg.extend_from_slice(b"echo/membership-cost/heartbeat");
            let sig = k.sign(&msg).unwrap();
            (peer, msg, sig, data)
        })
        .collect();

    // Every copy: public key out of the peer id (ed25519 ids inline it), verify.
    let t = Instant::now();
    let mut ok = 0u32;
    for i in 0..K {
        let (peer, msg, sig, _) = &signed[i as usize % signed.len()];
        let mh = peer.as_ref();
        let pk = PublicKey::try_decode_protobuf(mh.digest()).unwrap();
        ok += u32::from(pk.verify(msg, sig));
    }
    let per_copy = t.elapsed() / K;
    assert_eq!(ok, K);

    // Once per heartbeat: decode, rate limit, peer-table update, in a table of N peers.
    let mut table: HashMap<PeerId, PeerEntry> = (0..N)
        .map(|_| (PeerId::random(), PeerEntry::default()))
        .collect();
    let interval = Duration::from_secs(2);
    let t = Instant::now();
    for i in 0..K {
        let (peer, _, _, data) = &signed[i as usize % signed.len()];
        let hb = Heartbeat::decode(data, "membership-cost").unwrap();
        let now = Instant::now();
        let e = table.entry(*peer).or_default();
        let _ = e.heartbeat_gate.check(now, interval, false);
        e.record_heartbeat(hb, now);
    }
    let per_decode = t.elapsed() / K;

    let per_heartbeat = per_copy.as_secs_f64() * COPIES_PER_MESSAGE + per_decode.as_secs_f64();
    let core = |interval: Duration| N as f64 / interval.as_secs_f64() * per_heartbeat;
    let fixed = core(Duration::from_secs(2));
    let scaled_interval = heartbeat_interval(Duration::from_secs(2), N);
    let scaled = core(scaled_interval);
    println!(
        "{{\"verify_us\":{:.1},\"decode_update_us\":{:.1},\"per_heartbeat_us\":{:.1},\
         \"copies\":{COPIES_PER_MESSAGE},\"n\":{N},\"core_fraction_at_2s\":{fixed:.4},\
         \"scaled_interval_s\":{},\"core_fraction_scaled\":{scaled:.4},\"target_per_s\":{TARGET_HEARTBEATS_PER_S}}}",
        per_copy.as_secs_f64() * 1e6,
        per_decode.as_secs_f64() * 1e6,
        per_heartbeat * 1e6,
        scaled_interval.as_secs_f64(),
    );
}
