//! One module per subcommand.

mod demo;
mod export;
mod inspect;
mod keygen;
pub mod run;
mod status;

use crate::cli::Command;

pub fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Keygen(args) => keygen::keygen(&args),
        Command::Run(args) => run::run(args),
        Command::Inspect(args) => inspect::inspect(args),
        Command::Status(args) => status::status(&args),
        Command::Demo(args) => demo::demo(&args),
        Command::Export(args) => export::export(&args),
    }
}

/// The libp2p peer id of a node key (the same ed25519 key signs manifests and identifies the
/// node on the network).
pub fn peer_id(key: &storage::NodeKey) -> anyhow::Result<String> {
    let mut seed = key.seed();
    let kp = libp2p_identity::Keypair::ed25519_from_bytes(&mut seed)?;
    Ok(kp.public().to_peer_id().to_string())
}
