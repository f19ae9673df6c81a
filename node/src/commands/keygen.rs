//! `echo-node keygen --out DIR`.

use anyhow::Context;
use storage::NodeKey;

use crate::cli::KeygenArgs;

pub fn keygen(args: &KeygenArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let path = storage::DataDir::new(&args.out).key_file();
    if path.exists() {
        anyhow::bail!(
            "{} already exists; refusing to overwrite a node key (move it away first)",
            path.display()
        );
    }
    let key = NodeKey::generate();
    key.write_new(&path)
        .with_context(|| format!("writing {}", path.display()))?;
    let peer_id = crate::state::peer_id(&key)?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({"peer_id": peer_id, "public_key": key.public_hex(), "key_file": path})
        );
    } else {
        println!("key file:   {}", path.display());
        println!("peer id:    {peer_id}");
        println!("public key: {}", key.public_hex());
    }
    Ok(())
}
