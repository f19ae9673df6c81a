//! `echo-node admit PEER_ID --hours H --config LEARNER.toml`: an admission ticket for one
//! worker of a swarm whose learner runs `admission.mode = "ticket"` (`docs/protocol.md`,
//! "Admission"). Signed with the learner's key (read from its config's data dir, never
//! created here), printed as hex — the value of the worker's `admission.ticket` — and written
//! to `--out FILE` when asked.

use anyhow::Context;
use storage::admission::Ticket;
use storage::NodeKey;

use crate::cli::AdmitArgs;
use crate::config::{NodeConfig, Role};

/// Longest ticket `admit` writes: a year.
pub const MAX_HOURS: u64 = 24 * 366;

pub fn admit(args: &AdmitArgs) -> anyhow::Result<()> {
    let config = NodeConfig::load(&args.config)?;
    anyhow::ensure!(
        config.role == Role::Learner,
        "{} is a {} config: tickets are signed with the learner's key",
        args.config.display(),
        config.role
    );
    anyhow::ensure!(
        (1..=MAX_HOURS).contains(&args.hours),
        "--hours {} is outside 1..={MAX_HOURS}",
        args.hours
    );
    let peer: p2p::PeerId = args
        .peer_id
        .parse()
        .with_context(|| format!("`{}` is not a peer id", args.peer_id))?;
    let key_path = config.key_path();
    let key = NodeKey::read(&key_path)
        .with_context(|| format!("reading the learner key {}", key_path.display()))?;
    let now = crate::admission::now_unix_s();
    let ticket = Ticket::issue(
        key.signing_key(),
        &config.swarm_id,
        &peer.to_base58(),
        now,
        args.hours,
    )?;
    let hex = ticket.to_hex();
    if let Some(out) = &args.out {
        std::fs::write(out, format!("{hex}\n"))
            .with_context(|| format!("writing {}", out.display()))?;
    }
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "peer_id": ticket.peer_id, "swarm_id": ticket.swarm_id,
                "issued_unix_s": ticket.issued_unix_s, "expires_unix_s": ticket.expires_unix_s,
                "ticket": hex,
            })
        );
    } else {
        println!("{hex}");
        eprintln!(
            "ticket for {} in swarm {}, valid {} h (until {}); set it as the worker's \
             admission.ticket",
            ticket.peer_id,
            ticket.swarm_id,
            args.hours,
            super::inspect::utc_date(ticket.expires_unix_s.saturating_mul(1000))
        );
    }
    Ok(())
}
