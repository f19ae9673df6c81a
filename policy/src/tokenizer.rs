//! Tokenizers: the embedded byte-level tokenizer and Hugging Face `tokenizer.json` files.

use std::path::Path;

use crate::error::{PolicyError, Result};

/// Byte-level tokenizer of the embedded default model: ids 0..=255 are raw bytes, followed by
/// four special tokens. Text is never parsed for special tokens, so a prompt or completion that
/// *contains* the string `<|eos|>` cannot inject the EOS id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ByteTokenizer;

impl ByteTokenizer {
    /// Padding (never produced by the model in practice; used to fill finished rows).
    pub const PAD: u32 = 256;
    /// Beginning of sequence, first token of every prompt.
    pub const BOS: u32 = 257;
    /// End of response: the stop token.
    pub const EOS: u32 = 258;
    /// Separator between prompt and response.
    pub const SEP: u32 = 259;
    /// 256 bytes + 4 special tokens.
    pub const VOCAB_SIZE: usize = 260;

    /// Raw bytes of `text`, no special tokens.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        text.bytes().map(u32::from).collect()
    }

    /// `BOS, bytes(prompt), SEP`: the prompt template of the embedded model.
    pub fn encode_prompt(&self, prompt: &str) -> Vec<u32> {
        let mut ids = Vec::with_capacity(prompt.len() + 2);
        ids.push(Self::BOS);
        ids.extend(prompt.bytes().map(u32::from));
        ids.push(Self::SEP);
        ids
    }

    /// The bytes of the non-special ids (specials and out-of-range ids are dropped).
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        ids.iter().filter_map(|&i| u8::try_from(i).ok()).collect()
    }

    /// Lossy UTF-8 decoding of [`Self::decode_bytes`] (invalid sequences become U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids)).into_owned()
    }

    /// Names of the special tokens 256..=259 in a `tokenizer.json`.
    pub const SPECIAL_NAMES: [&'static str; 4] = ["<|pad|>", "<|bos|>", "<|eos|>", "<|sep|>"];

    /// This tokenizer as a Hugging Face `tokenizer.json`: a byte-level BPE without merges
    /// (GPT-2's byte-to-character map as pre-tokenizer and decoder, vocabulary = the 256 byte
    /// characters at their byte values) plus the four specials at 256..=259, so that
    /// `tokenizers` (Rust or Python) encodes text to the same ids. [`Tokenizer::from_file`]
    /// recognises the file and reads it back as this tokenizer (with its prompt template, and
    /// still never parsing special tokens out of text, which `tokenizers` would).
    pub fn to_hf_json(&self) -> String {
        let chars = byte_chars();
        let vocab: serde_json::Map<String, serde_json::Value> = (0..=255u8)
            .map(|b| (chars[usize::from(b)].to_string(), u32::from(b).into()))
            .collect();
        let added: Vec<serde_json::Value> = Self::SPECIAL_NAMES
            .iter()
            .zip(Self::PAD..)
            .map(|(name, id)| {
                serde_json::json!({
                    "id": id, "content": name, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true,
                })
            })
            .collect();
        let byte_level = serde_json::json!({
            "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
            "use_regex": false,
        });
        let json = serde_json::json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": byte_level,
            "post_processor": null,
            "decoder": byte_level,
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": [],
            },
        });
        serde_json::to_string_pretty(&json).unwrap_or_default()
    }

    /// The built-in chat template (`policy::chat`, `Template::Builtin`:
    /// `BOS [system "\n"] user SEP assistant EOS user SEP …`) in Jinja, as `transformers`'
    /// `apply_chat_template` renders it with `bos_token` = `<|bos|>` and `eos_token` =
    /// `<|eos|>`: a user turn ends with `<|sep|>`, which is also the generation prompt. Text
    /// that contains a special token's name renders differently (Hugging Face tokenizers
    /// parse it; this tokenizer never does).
    pub const CHAT_TEMPLATE: &'static str = "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{% if not loop.first %}{{ raise_exception('the system message must come first') }}{% endif %}{{ m.content }}{{ '\\n' }}{% elif m.role == 'user' %}{{ m.content }}<|sep|>{% elif m.role == 'assistant' %}{{ m.content }}{{ eos_token }}{% else %}{{ raise_exception('unknown role ' ~ m.role) }}{% endif %}{% endfor %}";

    /// A `tokenizer_config.json` for `transformers.AutoTokenizer` beside [`Self::to_hf_json`],
    /// with the built-in chat template ([`Self::CHAT_TEMPLATE`]).
    pub fn hf_tokenizer_config_json(model_max_length: usize) -> String {
        let [pad, bos, eos, sep] = Self::SPECIAL_NAMES;
        let json = serde_json::json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "pad_token": pad, "bos_token": bos, "eos_token": eos, "sep_token": sep,
            "add_bos_token": false, "add_eos_token": false,
            "model_max_length": model_max_length,
            "clean_up_tokenization_spaces": false,
            "chat_template": Self::CHAT_TEMPLATE,
        });
        serde_json::to_string_pretty(&json).unwrap_or_default()
    }

    /// Whether `t` is [`Self::to_hf_json`] (compared in `tokenizers`' own serialisation, so
    /// the file's formatting does not matter).
    fn is_hf_form(t: &tokenizers::Tokenizer) -> bool {
        // Cheap first: a real model's vocabulary is never serialised for the comparison.
        if t.get_vocab_size(true) != Self::VOCAB_SIZE {
            return false;
        }
        let ours = tokenizers::Tokenizer::from_bytes(ByteTokenizer.to_hf_json().as_bytes());
        match (ours, t.to_string(false)) {
            (Ok(ours), Ok(theirs)) => ours.to_string(false).is_ok_and(|o| o == theirs),
            _ => false,
        }
    }
}

/// GPT-2's byte-to-character map (used by every byte-level BPE): printable Latin-1 bytes
/// stand for themselves, the other 68 bytes for U+0100.. in byte order, so that no byte is
/// a control or space character.
fn byte_chars() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        out[usize::from(b)] = if printable(b) {
            char::from(b)
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap_or('\u{fffd}')
        };
    }
    out
}

/// A Hugging Face tokenizer plus the few facts generation needs (stop ids, pad id, template).
#[derive(Clone)]
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    eos: Vec<u32>,
    pad: u32,
    chatml: bool,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("vocab_size", &self.inner.get_vocab_size(true))
            .field("eos", &self.eos)
            .field("pad", &self.pad)
            .field("chatml", &self.chatml)
            .finish()
    }
}

/// The tokenizer of a policy: byte-level (embedded default) or Hugging Face.
#[derive(Debug, Clone)]
pub enum Tokenizer {
    /// The embedded byte tokenizer.
    Byte(ByteTokenizer),
    /// A `tokenizer.json` loaded from a local folder.
    Hf(Box<HfTokenizer>),
}

impl Tokenizer {
    /// The embedded byte-level tokenizer.
    pub fn byte() -> Self {
        Tokenizer::Byte(ByteTokenizer)
    }

    /// Loads `tokenizer.json`. `extra_eos` are stop ids from `config.json` /
    /// `generation_config.json`; `<|im_end|>` and `<|endoftext|>` are added when the vocabulary
    /// has them.
    pub fn from_file(path: &Path, extra_eos: &[u32]) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| PolicyError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let inner =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| PolicyError::CorruptFile {
                path: path.to_path_buf(),
                reason: format!("not a valid tokenizer.json: {e}"),
            })?;
        Ok(Self::from_hf(inner, extra_eos))
    }

    /// Wraps an in-memory Hugging Face tokenizer; the embedded byte tokenizer's own form
    /// ([`ByteTokenizer::to_hf_json`]) comes back as [`Tokenizer::Byte`].
    pub fn from_hf(inner: tokenizers::Tokenizer, extra_eos: &[u32]) -> Self {
        if ByteTokenizer::is_hf_form(&inner) {
            return Tokenizer::byte();
        }
        let mut eos: Vec<u32> = extra_eos.to_vec();
        for name in ["<|im_end|>", "<|endoftext|>", "</s>", "<eos>"] {
            if let Some(id) = inner.token_to_id(name) {
                if !eos.contains(&id) {
                    eos.push(id);
                }
            }
        }
        let pad = ["<|endoftext|>", "<pad>", "<|pad|>"]
            .iter()
            .find_map(|t| inner.token_to_id(t))
            .or_else(|| eos.first().copied())
            .unwrap_or(0);
        let chatml = inner.token_to_id("<|im_start|>").is_some()
            && inner.token_to_id("<|im_end|>").is_some();
        Tokenizer::Hf(Box::new(HfTokenizer {
            inner,
            eos,
            pad,
            chatml,
        }))
    }

    /// Number of ids the tokenizer can produce (including special tokens).
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Byte(_) => ByteTokenizer::VOCAB_SIZE,
            Tokenizer::Hf(t) => t.inner.get_vocab_size(true),
        }
    }

    /// Encodes raw text (no template, no BOS).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            Tokenizer::Byte(b) => Ok(b.encode(text)),
            Tokenizer::Hf(t) => t
                .inner
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| PolicyError::Tokenizer(e.to_string())),
        }
    }

    /// Encodes a task prompt with the model's prompt template: `BOS prompt SEP` for the byte
    /// tokenizer; a ChatML user turn followed by the assistant header for Qwen tokenizers
    /// (`<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n`); the raw text otherwise.
    pub fn encode_prompt(&self, prompt: &str) -> Result<Vec<u32>> {
        match self {
            Tokenizer::Byte(b) => Ok(b.encode_prompt(prompt)),
            Tokenizer::Hf(t) if t.chatml => self.encode(&format!(
                "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
            )),
            Tokenizer::Hf(_) => self.encode(prompt),
        }
    }

    /// Decodes ids to text, skipping special tokens; invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match self {
            Tokenizer::Byte(b) => Ok(b.decode(ids)),
            Tokenizer::Hf(t) => t
                .inner
                .decode(ids, true)
                .map_err(|e| PolicyError::Tokenizer(e.to_string())),
        }
    }

    /// Ids that end a response.
    pub fn eos_ids(&self) -> Vec<u32> {
        match self {
            Tokenizer::Byte(_) => vec![ByteTokenizer::EOS],
            Tokenizer::Hf(t) => t.eos.clone(),
        }
    }

    /// The id of the token whose text is exactly `text` (special tokens such as
    /// `<|im_start|>`); `None` for the byte tokenizer, which has no named tokens.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        match self {
            Tokenizer::Byte(_) => None,
            Tokenizer::Hf(t) => t.inner.token_to_id(text),
        }
    }

    /// The vocabulary text of token `id` (e.g. `<|im_end|>`); `None` for the byte
    /// tokenizer's special tokens and for unknown ids.
    pub fn token_text(&self, id: u32) -> Option<String> {
        match self {
            Tokenizer::Byte(_) => None,
            Tokenizer::Hf(t) => t.inner.id_to_token(id),
        }
    }

    /// Id used to fill rows that have finished in batched generation.
    pub fn pad_id(&self) -> u32 {
        match self {
            Tokenizer::Byte(_) => ByteTokenizer::PAD,
            Tokenizer::Hf(t) => t.pad,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_round_trip_and_no_special_injection() {
        let t = Tokenizer::byte();
        let ids = t.encode("héllo <|eos|>").unwrap();
        assert!(ids.iter().all(|&i| i < 256));
        assert_eq!(t.decode(&ids).unwrap(), "héllo <|eos|>");
        let p = t.encode_prompt("1+1=").unwrap();
        assert_eq!(p.first(), Some(&ByteTokenizer::BOS));
        assert_eq!(p.last(), Some(&ByteTokenizer::SEP));
        assert_eq!(t.decode(&p).unwrap(), "1+1=");
    }

    #[test]
    fn byte_decode_is_lossy_on_invalid_utf8_and_ignores_bad_ids() {
        let t = Tokenizer::byte();
        let s = t.decode(&[0xff, 0xfe, b'a' as u32, 999_999, 258]).unwrap();
        assert!(s.ends_with('a'));
        assert!(s.contains('\u{fffd}'));
    }

    #[test]
    fn missing_or_corrupt_tokenizer_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokenizer.json");
        let e = Tokenizer::from_file(&p, &[]).unwrap_err();
        assert!(matches!(e, PolicyError::Io { .. }), "{e}");
        std::fs::write(&p, b"{ not json").unwrap();
        let e = Tokenizer::from_file(&p, &[]).unwrap_err();
        assert!(matches!(e, PolicyError::CorruptFile { .. }), "{e}");
        assert!(e.to_string().contains("tokenizer.json"));
    }

    #[test]
    fn byte_tokenizer_json_encodes_as_the_byte_tokenizer_in_hf_tokenizers() {
        let json = ByteTokenizer.to_hf_json();
        let hf = tokenizers::Tokenizer::from_bytes(json.as_bytes()).unwrap();
        assert_eq!(hf.get_vocab_size(true), ByteTokenizer::VOCAB_SIZE);
        for (name, id) in ByteTokenizer::SPECIAL_NAMES
            .iter()
            .zip(ByteTokenizer::PAD..)
        {
            assert_eq!(hf.token_to_id(name), Some(id), "{name}");
        }
        // All of ASCII (controls and spaces included) and multi-byte UTF-8.
        let all: String = (0u8..128).map(char::from).collect::<String>() + " héllo ∑ 😀 1+1=2";
        for text in [all.as_str(), "  two  spaces", "\n\t"] {
            let ids = hf.encode(text, false).unwrap().get_ids().to_vec();
            assert_eq!(ids, ByteTokenizer.encode(text), "{text:?}");
            assert_eq!(hf.decode(&ids, true).unwrap(), text);
        }
    }

    #[test]
    fn byte_tokenizer_json_reads_back_as_the_byte_tokenizer() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokenizer.json");
        std::fs::write(&p, ByteTokenizer.to_hf_json()).unwrap();
        let t = Tokenizer::from_file(&p, &[ByteTokenizer::EOS]).unwrap();
        assert!(matches!(t, Tokenizer::Byte(_)), "{t:?}");
        // Formatting does not matter, content does: re-serialised compactly it is still ours,
        // with one special renamed it is a plain Hugging Face tokenizer.
        let v: serde_json::Value = serde_json::from_str(&ByteTokenizer.to_hf_json()).unwrap();
        std::fs::write(&p, v.to_string()).unwrap();
        let t = Tokenizer::from_file(&p, &[]).unwrap();
        assert_eq!(
            t.encode_prompt("1+1=").unwrap(),
            ByteTokenizer.encode_prompt("1+1=")
        );
        let mut v = v;
        v["added_tokens"][2]["content"] = "<|end|>".into();
        std::fs::write(&p, v.to_string()).unwrap();
        let t = Tokenizer::from_file(&p, &[]).unwrap();
        assert!(matches!(t, Tokenizer::Hf(_)));
    }
}
