//! Admission (`docs/security.md`, "Probation and admission"; `docs/protocol.md`,
//! "Admission"): the credential a worker presents in its heartbeats, the learner's verdict on
//! it, and the ban list kept across restarts.
//!
//! - **Worker** ([`credential`]): its ticket (`admission.ticket`, written by
//!   `echo-node admit`) and, when `admission.pow_bits > 0`, a proof of work on its peer id,
//!   solved once and kept in `<data_dir>/admission.work` (so a restart does not pay again).
//! - **Learner** ([`Gate`]): `open` admits everyone whose proof of work meets
//!   `admission.pow_bits`; `allow_list` admits the peers of `network.allow_list`; `ticket`
//!   admits a peer presenting an unexpired ticket for its own peer id signed by the learner's
//!   key (and the proof of work, when asked). A worker that is not admitted is never pulled
//!   from; it is not struck (it may simply lack a ticket), and the reason is shown in status.
//! - **Bans** ([`restore_bans`], [`record_bans`]): every ban of the network service is
//!   written to `<data_dir>/bans.state` (`storage::bans`) and handed back to the service at
//!   the next start, so a ban survives a restart.
//!
//! Owns: these decisions and files. Must not touch: the formats (`storage::admission`,
//! `storage::bans`), the pull or the strike rules.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use anyhow::Context;
use storage::admission::{check_work, solve_work, Credential, Ticket};
use storage::bans::{BanEntry, BanFile};

use crate::config::{AdmissionMode, NodeConfig};

/// File of a worker's solved proof of work: `bits nonce` for its peer id and swarm.
pub const WORK_FILE: &str = "admission.work";

/// The credential this worker presents (hex), or `None` when it has nothing to present.
/// Solves the proof of work if asked and not already on disk (blocking: about 2^bits hashes).
pub fn credential(config: &NodeConfig, peer_id: &str) -> anyhow::Result<Option<String>> {
    let a = &config.admission;
    let ticket = a
        .ticket
        .as_deref()
        .map(Ticket::from_hex)
        .transpose()
        .context("admission.ticket")?;
    if let Some(t) = &ticket {
        if t.peer_id != peer_id {
            tracing::warn!(ticket_for = %t.peer_id, "admission.ticket is for another peer id: the learner will refuse it");
        }
    }
    let work_nonce = if a.pow_bits == 0 {
        None
    } else {
        Some(solved_work(config, peer_id)?)
    };
    let c = Credential { ticket, work_nonce };
    Ok((!c.is_empty()).then(|| c.to_hex()))
}

/// The nonce of `<data_dir>/admission.work` when it proves `pow_bits` for this peer, else a
/// new one (written there).
fn solved_work(config: &NodeConfig, peer_id: &str) -> anyhow::Result<u64> {
    let bits = config.admission.pow_bits;
    let path = config.data_dir.join(WORK_FILE);
    if let Some(n) = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .filter(|&n| check_work(&config.swarm_id, peer_id, n, bits))
    {
        return Ok(n);
    }
    let t0 = std::time::Instant::now();
    tracing::info!(bits, "solving the admission proof of work");
    let n = solve_work(&config.swarm_id, peer_id, bits, 0)
        .context("no nonce proves the admission work")?;
    tracing::info!(
        bits,
        nonce = n,
        secs = t0.elapsed().as_secs_f64(),
        "admission proof of work solved"
    );
    std::fs::write(&path, format!("{bits} {n}\n"))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(n)
}

/// Why a worker is not admitted.
pub type Refusal = String;

/// The learner's admission rule, with the verdicts of the credentials it saw cached (a
/// verdict changes only with the credential, or when a ticket expires).
pub struct Gate {
    mode: AdmissionMode,
    pow_bits: u32,
    swarm_id: String,
    learner: [u8; 32],
    allow: Vec<String>,
    /// peer → (credential seen, admitted until (Unix s) or why not).
    cache: HashMap<String, (Option<String>, Result<u64, Refusal>)>,
    /// When each identity admitted within the pricing window was first admitted (Unix s):
    /// the proof of work a new identity must show rises with their number
    /// (`control::admission::pow_price`).
    recent: std::collections::VecDeque<u64>,
    pricing: control::admission::PowPricing,
}

/// Peers whose verdict [`Gate`] caches at most.
const MAX_CACHED: usize = 4096;

impl Gate {
    pub fn new(config: &NodeConfig, learner: [u8; 32]) -> Self {
        Gate {
            mode: config.admission.mode,
            pow_bits: config.admission.pow_bits,
            swarm_id: config.swarm_id.clone(),
            learner,
            allow: config.network.allow_list.clone(),
            cache: HashMap::new(),
            recent: std::collections::VecDeque::new(),
            pricing: control::admission::PowPricing::default(),
        }
    }

    /// The bits of work a new identity must prove at `now` (Unix s): `admission.pow_bits`,
    /// plus one per identity admitted within the window beyond the free allowance.
    pub fn price(&mut self, now: u64) -> u32 {
        let window = self.pricing.window_secs;
        while self
            .recent
            .front()
            .is_some_and(|&t| now.saturating_sub(t) >= window)
        {
            self.recent.pop_front();
        }
        control::admission::pow_price(&self.pricing, self.pow_bits, self.recent.len() as u64)
    }

    /// Whether `peer` (base58), presenting `credential` (its heartbeat's `admission`), may
    /// contribute groups at `now_unix_s`.
    pub fn admits(
        &mut self,
        peer: &str,
        credential: Option<&str>,
        now_unix_s: u64,
    ) -> Result<(), Refusal> {
        if self.mode == AdmissionMode::Open && self.pow_bits == 0 {
            return Ok(());
        }
        if let Some((seen, verdict)) = self.cache.get(peer) {
            if seen.as_deref() == credential {
                return match verdict {
                    Ok(until) if now_unix_s < *until => Ok(()),
                    Ok(_) => Err("its ticket expired".into()),
                    Err(why) => Err(why.clone()),
                };
            }
        }
        let newcomer = !matches!(self.cache.get(peer), Some((_, Ok(_))));
        let bits = self.price(now_unix_s);
        let verdict = self.judge(peer, credential, now_unix_s, bits);
        if newcomer && verdict.is_ok() && self.pow_bits > 0 {
            self.recent.push_back(now_unix_s);
            if self.recent.len() > MAX_CACHED {
                self.recent.pop_front();
            }
        }
        if self.cache.len() >= MAX_CACHED {
            self.cache.clear();
        }
        self.cache.insert(
            peer.to_string(),
            (credential.map(String::from), verdict.clone()),
        );
        verdict.map(|_| ())
    }

    /// The verdict and, when admitted, until when (Unix seconds).
    fn judge(
        &self,
        peer: &str,
        credential: Option<&str>,
        now: u64,
        bits: u32,
    ) -> Result<u64, Refusal> {
        if self.mode == AdmissionMode::AllowList && !self.allow.iter().any(|p| p == peer) {
            return Err("not in network.allow_list".into());
        }
        let c = match credential {
            Some(hex) => Credential::from_hex(hex).map_err(|e| format!("bad credential: {e}"))?,
            None => Credential::default(),
        };
        if bits > 0 {
            let ok = c
                .work_nonce
                .is_some_and(|n| check_work(&self.swarm_id, peer, n, bits));
            if !ok {
                return Err(format!(
                    "no proof of {bits} bits of work on its peer id ({} asked, raised by the \
                     identities admitted in the last {} s)",
                    self.pow_bits, self.pricing.window_secs
                ));
            }
        }
        if self.mode != AdmissionMode::Ticket {
            return Ok(u64::MAX);
        }
        let t = c.ticket.ok_or("no admission ticket")?;
        t.check(&self.learner, &self.swarm_id, peer, now)
            .map_err(|e| e.to_string())?;
        Ok(t.expires_unix_s)
    }
}

/// Seconds since the Unix epoch.
pub fn now_unix_s() -> u64 {
    storage::unix_ms() / 1000
}

/// Hands the bans of a previous run back to the network service, each under the label `known`
/// gives its reason's name (the caller's list of every offence, `crate::offences`); a ban
/// whose peer id or reason is unknown is skipped.
pub async fn restore_bans(
    client: &p2p::Client,
    file: &BanFile,
    known: impl Fn(&str) -> Option<p2p::ReportLabel>,
) -> usize {
    let mut n = 0;
    for e in file.entries() {
        let (Ok(peer), Some(reason)) = (e.peer_id.parse::<p2p::PeerId>(), known(&e.reason)) else {
            tracing::warn!(peer = %e.peer_id, reason = %e.reason, "unreadable persisted ban skipped");
            continue;
        };
        if client.ban(peer, reason).await.is_ok() {
            n += 1;
        }
    }
    if n > 0 {
        tracing::info!(bans = n, "bans of the previous run restored");
    }
    n
}

/// Writes every new ban of the network service to `file`, until the service stops: woken
/// by each change of the peer view (a ban is one), never polling.
pub async fn record_bans(client: p2p::Client, file: BanFile) {
    let mut changes = client.peer_changes();
    let mut known: BTreeSet<String> = file.entries().into_iter().map(|e| e.peer_id).collect();
    loop {
        // The ban reason is shown only in the status view: read from there, by peer id.
        let Ok(net) = client.status().await else {
            return;
        };
        for p in net.peers.iter().filter(|p| p.banned) {
            if known.contains(&p.peer_id) {
                continue;
            }
            let entry = BanEntry {
                peer_id: p.peer_id.clone(),
                reason: p.ban_reason.clone().unwrap_or_else(|| "unknown".into()),
                banned_unix_ms: storage::unix_ms(),
            };
            match file.record(entry) {
                Ok(_) => {
                    known.insert(p.peer_id.clone());
                }
                Err(e) => tracing::warn!(error = %e, "could not persist a ban"),
            }
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

/// Opens `<data_dir>/bans.state`; a corrupt file is set aside (renamed) with a warning
/// rather than stopping the node.
pub fn open_ban_file(data_dir: &Path) -> anyhow::Result<BanFile> {
    let path = data_dir.join(storage::bans::BANS_FILE_NAME);
    match BanFile::open(&path) {
        Ok(f) => Ok(f),
        Err(e) => {
            let aside = path.with_extension("state.corrupt");
            tracing::warn!(error = %e, aside = %aside.display(), "the ban list is unreadable; set aside, starting without it");
            std::fs::rename(&path, &aside)
                .with_context(|| format!("moving {} aside", path.display()))?;
            Ok(BanFile::open(&path)?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use storage::NodeKey;

    fn config(mode: AdmissionMode, pow_bits: u32) -> NodeConfig {
        let mut c = NodeConfig::new(crate::config::Role::Learner, "adm", "d".into());
        c.admission.mode = mode;
        c.admission.pow_bits = pow_bits;
        c
    }

    #[test]
    fn tickets_admit_their_peer_until_they_expire() {
        let learner = NodeKey::generate();
        let mut gate = Gate::new(
            &config(AdmissionMode::Ticket, 0),
            learner.verifying_key().to_bytes(),
        );
        let t = Ticket::issue(learner.signing_key(), "adm", "12D3a", 1000, 1).unwrap();
        let cred = Credential {
            ticket: Some(t),
            work_nonce: None,
        }
        .to_hex();
        assert_eq!(gate.admits("12D3a", Some(&cred), 1000), Ok(()));
        assert!(
            gate.admits("12D3b", Some(&cred), 1000).is_err(),
            "another peer"
        );
        assert!(gate.admits("12D3a", None, 1000).is_err());
        assert!(gate.admits("12D3a", Some("zz"), 1000).is_err());
        // Cached, and the cache still expires the ticket.
        assert_eq!(gate.admits("12D3a", Some(&cred), 4599), Ok(()));
        let e = gate.admits("12D3a", Some(&cred), 4600).unwrap_err();
        assert!(e.contains("expired"), "{e}");
        // A ticket signed by another key.
        let rogue = NodeKey::generate();
        let t = Ticket::issue(rogue.signing_key(), "adm", "12D3c", 1000, 1).unwrap();
        let cred = Credential {
            ticket: Some(t),
            work_nonce: None,
        }
        .to_hex();
        assert!(gate.admits("12D3c", Some(&cred), 1000).is_err());
    }

    #[test]
    fn open_swarms_may_ask_for_work_and_allow_lists_name_peers() {
        let key = NodeKey::generate().verifying_key().to_bytes();
        let mut open = Gate::new(&config(AdmissionMode::Open, 0), key);
        assert_eq!(open.admits("anyone", None, 0), Ok(()));
        let mut work = Gate::new(&config(AdmissionMode::Open, 8), key);
        assert!(work.admits("12D3a", None, 0).is_err());
        let n = solve_work("adm", "12D3a", 8, 0).unwrap();
        let cred = |n| {
            Credential {
                ticket: None,
                work_nonce: Some(n),
            }
            .to_hex()
        };
        assert_eq!(work.admits("12D3a", Some(&cred(n)), 0), Ok(()));
        // The same work does not admit another identity.
        assert_eq!(
            work.admits("12D3b", Some(&cred(n)), 0).is_ok(),
            check_work("adm", "12D3b", n, 8)
        );
        let mut c = config(AdmissionMode::AllowList, 0);
        c.network.allow_list = vec!["12D3a".into()];
        let mut allow = Gate::new(&c, key);
        assert_eq!(allow.admits("12D3a", None, 0), Ok(()));
        assert!(allow.admits("12D3b", None, 0).is_err());
    }

    #[test]
    fn the_price_of_work_rises_with_the_young_identities_admitted_recently() {
        let key = NodeKey::generate().verifying_key().to_bytes();
        let mut gate = Gate::new(&config(AdmissionMode::Open, 4), key);
        let free = gate.pricing.free_young;
        let cred = |n| {
            Credential {
                ticket: None,
                work_nonce: Some(n),
            }
            .to_hex()
        };
        // A nonce proving exactly `bits` (not one more) for `peer`.
        let exactly = |peer: &str, bits: u32| {
            (0..)
                .find(|&n| {
                    check_work("adm", peer, n, bits) && !check_work("adm", peer, n, bits + 1)
                })
                .unwrap()
        };
        for i in 0..free {
            let peer = format!("12D3young{i}");
            let n = exactly(&peer, 4);
            assert_eq!(gate.admits(&peer, Some(&cred(n)), 10), Ok(()), "{peer}");
        }
        assert_eq!(
            gate.price(10),
            4,
            "the free allowance is used up, not exceeded"
        );
        // Admitted again (cached): an identity already admitted does not pay again.
        let n0 = exactly("12D3young0", 4);
        assert_eq!(gate.admits("12D3young0", Some(&cred(n0)), 11), Ok(()));
        assert_eq!(gate.price(11), 4);
        let peer = "12D3late";
        gate.recent.push_back(11); // one more young identity admitted
        assert_eq!(gate.price(11), 5);
        let e = gate
            .admits(peer, Some(&cred(exactly(peer, 4))), 11)
            .unwrap_err();
        assert!(e.contains("5 bits"), "{e}");
        assert_eq!(gate.admits(peer, Some(&cred(exactly(peer, 5))), 11), Ok(()));
        // The window passes: the price falls back.
        let later = 11 + gate.pricing.window_secs;
        assert_eq!(gate.price(later), 4);
    }

    #[test]
    fn a_worker_solves_its_work_once_and_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = NodeConfig::new(crate::config::Role::Rollout, "adm", dir.path().into());
        assert_eq!(credential(&c, "12D3a").unwrap(), None, "nothing to present");
        c.admission.pow_bits = 6;
        let hex = credential(&c, "12D3a").unwrap().unwrap();
        let n = Credential::from_hex(&hex).unwrap().work_nonce.unwrap();
        assert!(check_work("adm", "12D3a", n, 6));
        let kept = std::fs::read_to_string(dir.path().join(WORK_FILE)).unwrap();
        assert_eq!(kept.trim(), format!("6 {n}"));
        // Another peer id (a new key in the same data dir) solves anew.
        let other = credential(&c, "12D3b").unwrap().unwrap();
        let m = Credential::from_hex(&other).unwrap().work_nonce.unwrap();
        assert!(check_work("adm", "12D3b", m, 6));
    }

    #[test]
    fn persisted_bans_reopen_and_a_corrupt_list_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let f = open_ban_file(dir.path()).unwrap();
        f.record(BanEntry {
            peer_id: "12D3a".into(),
            reason: "replay".into(),
            banned_unix_ms: 1,
        })
        .unwrap();
        assert_eq!(open_ban_file(dir.path()).unwrap().entries().len(), 1);
        std::fs::write(dir.path().join(storage::bans::BANS_FILE_NAME), b"junk").unwrap();
        let f = open_ban_file(dir.path()).unwrap();
        assert!(f.entries().is_empty());
        assert!(dir.path().join("bans.state.corrupt").exists());
    }
}
