//! Launching a learning swarm of real `echo-node run` processes on 127.0.0.1 for the
//! scenarios that need more control than `echo-node demo` gives (`faults`, `ablation`).

use std::path::Path;

use anyhow::Context;

use crate::broadcast::{free_port, keygen, spawn, Procs};

/// A running swarm: `procs.0[0]` is the learner, `procs.0[i + 1]` worker i.
pub struct Swarm {
    pub procs: Procs,
    pub learner_admin: String,
    pub worker_admins: Vec<String>,
}

fn network(admin: &str, listen: &str, extra: &str) -> String {
    format!(
        "[network]\nlisten = [\"{listen}\"]\nadmin = \"{admin}\"\nmdns = false\nautonat = false\n\
         quic = false\nheartbeat_interval_ms = 500\n{extra}\n"
    )
}

/// Starts a learner with `learner_sections` (TOML tables after `[network]`) and one worker
/// per entry of `worker_costs` (declared $/h), all under `root`.
pub fn launch(
    bin: &Path,
    root: &Path,
    swarm_id: &str,
    learner_sections: &str,
    worker_costs: &[f64],
) -> anyhow::Result<Swarm> {
    let ldir = root.join("learner");
    std::fs::create_dir_all(&ldir)?;
    let key = keygen(bin, &ldir)?;
    let (lpk, lpeer) = (
        key["public_key"]
            .as_str()
            .context("public_key")?
            .to_string(),
        key["peer_id"].as_str().context("peer_id")?.to_string(),
    );
    let port = free_port()?;
    let learner_admin = format!("127.0.0.1:{}", free_port()?);
    let lcfg = ldir.join("node.toml");
    std::fs::write(
        &lcfg,
        format!(
            "role = \"learner\"\nswarm_id = \"{swarm_id}\"\ndata_dir = \"{}\"\n{}{learner_sections}",
            ldir.display(),
            network(&learner_admin, &format!("/ip4/127.0.0.1/tcp/{port}"), "")
        ),
    )?;
    let mut procs = Procs(Vec::new());
    procs.0.push((
        "learner".into(),
        spawn(bin, &lcfg, &[], &ldir.join("node.log"))?,
    ));
    let mut worker_admins = Vec::new();
    for (i, cost) in worker_costs.iter().enumerate() {
        let dir = root.join(format!("w{i}"));
        std::fs::create_dir_all(&dir)?;
        let admin = format!("127.0.0.1:{}", free_port()?);
        let cfg = dir.join("node.toml");
        std::fs::write(
            &cfg,
            format!(
                "role = \"rollout\"\nswarm_id = \"{swarm_id}\"\ndata_dir = \"{}\"\nlearner_public_key = \"{lpk}\"\n{}\
                 [storage]\nmax_pending_groups = 4\n",
                dir.display(),
                network(
                    &admin,
                    "/ip4/127.0.0.1/tcp/0",
                    &format!(
                        "bootstrap = [\"/ip4/127.0.0.1/tcp/{port}/p2p/{lpeer}\"]\ncost_per_hour = {cost}"
                    )
                )
            ),
        )?;
        procs.0.push((
            format!("w{i}"),
            spawn(bin, &cfg, &[], &dir.join("node.log"))?,
        ));
        worker_admins.push(admin);
    }
    Ok(Swarm {
        procs,
        learner_admin,
        worker_admins,
    })
}
