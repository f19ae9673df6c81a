//! Node identity key file (`node.key`).
//!
//! Format v1 (text, two lines, file mode 0600):
//! ```text
//! echo-node-key v1 ed25519
//! <64 lowercase hex chars: the 32-byte ed25519 secret seed>
//! ```
//! The libp2p `PeerId` derives from the same key (the `p2p` crate converts the seed), so the
//! identity that signs the learner's manifests, chain plans and activation orders is the
//! identity peers see; a rollout worker signs its trajectory groups with it too, so the learner
//! checks a group against the peer id it was pulled from.

use std::fs;
use std::io::Write;
use std::path::Path;

use ed25519_dalek::{SigningKey, VerifyingKey};

use crate::error::{Result, StorageError};

/// First line of a v1 key file.
pub const KEY_FILE_HEADER: &str = "echo-node-key v1 ed25519";
/// Default file name inside a node's data directory.
pub const KEY_FILE_NAME: &str = "node.key";

/// A node's ed25519 identity.
#[derive(Clone)]
pub struct NodeKey {
    signing: SigningKey,
}

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeKey")
            .field("public", &self.public_hex())
            .finish_non_exhaustive()
    }
}

impl NodeKey {
    /// A fresh key from the OS RNG.
    pub fn generate() -> Self {
        NodeKey {
            signing: SigningKey::generate(&mut rand::rngs::OsRng),
        }
    }

    pub fn from_seed(seed: [u8; 32]) -> Self {
        NodeKey {
            signing: SigningKey::from_bytes(&seed),
        }
    }

    /// The 32-byte secret seed (what libp2p's `Keypair::ed25519_from_bytes` takes).
    pub fn seed(&self) -> [u8; 32] {
        self.signing.to_bytes()
    }

    pub fn signing_key(&self) -> &SigningKey {
        &self.signing
    }

    pub fn verifying_key(&self) -> VerifyingKey {
        self.signing.verifying_key()
    }

    pub fn public_hex(&self) -> String {
        hex::encode(self.verifying_key().as_bytes())
    }

    /// Writes the key to `path`; refuses to overwrite an existing file.
    pub fn write_new(&self, path: &Path) -> Result<()> {
        let mut opts = fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts.open(path).map_err(|e| StorageError::io(path, e))?;
        let text = format!("{KEY_FILE_HEADER}\n{}\n", hex::encode(self.seed()));
        f.write_all(text.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| StorageError::io(path, e))
    }

    pub fn read(path: &Path) -> Result<Self> {
        let bad = |reason: &str| StorageError::KeyFile {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        };
        let meta = fs::metadata(path).map_err(|e| StorageError::io(path, e))?;
        if meta.len() > 4096 {
            return Err(bad("file is too large to be a key file"));
        }
        let text = fs::read_to_string(path).map_err(|_| bad("not a UTF-8 text key file"))?;
        let mut lines = text.lines();
        if lines.next() != Some(KEY_FILE_HEADER) {
            return Err(bad(&format!("first line must be `{KEY_FILE_HEADER}`")));
        }
        let seed_hex = lines.next().ok_or_else(|| bad("missing key line"))?.trim();
        let seed: [u8; 32] = hex::decode(seed_hex)
            .ok()
            .and_then(|v| v.try_into().ok())
            .ok_or_else(|| bad("key line must be 64 hex characters"))?;
        Ok(NodeKey::from_seed(seed))
    }

    /// Reads the key at `path`, or creates one there if the file does not exist.
    pub fn load_or_create(path: &Path) -> Result<(Self, bool)> {
        if path.exists() {
            Ok((Self::read(path)?, false))
        } else {
            let key = Self::generate();
            key.write_new(path)?;
            Ok((key, true))
        }
    }
}

/// Parses a hex ed25519 public key as it appears in configs and `keygen` output.
pub fn parse_public_key(hex_str: &str) -> Result<VerifyingKey> {
    let bytes: [u8; 32] = hex::decode(hex_str.trim())
        .ok()
        .and_then(|v| v.try_into().ok())
        .ok_or_else(|| StorageError::invalid("public key", "expected 64 hex characters"))?;
    VerifyingKey::from_bytes(&bytes)
        .map_err(|e| StorageError::invalid("public key", format!("not an ed25519 point: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_file_round_trips_and_refuses_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY_FILE_NAME);
        let key = NodeKey::generate();
        key.write_new(&path).unwrap();
        assert!(key.write_new(&path).is_err(), "must not overwrite a key");
        let back = NodeKey::read(&path).unwrap();
        assert_eq!(back.seed(), key.seed());
        assert_eq!(
            parse_public_key(&key.public_hex()).unwrap(),
            key.verifying_key()
        );
    }

    #[test]
    fn garbage_key_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        for text in [
            "",
            "echo-node-key v1 ed25519\nzz",
            "hello\n00",
            "echo-node-key v1 ed25519\n",
        ] {
            std::fs::write(&path, text).unwrap();
            assert!(matches!(
                NodeKey::read(&path),
                Err(StorageError::KeyFile { .. })
            ));
        }
        assert!(parse_public_key("abc").is_err());
    }

    proptest::proptest! {
        #[test]
        fn random_key_files_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("k");
            std::fs::write(&path, &bytes).unwrap();
            proptest::prop_assert!(NodeKey::read(&path).is_err());
            let text = String::from_utf8_lossy(&bytes);
            let _ = parse_public_key(&text);
        }
    }
}
