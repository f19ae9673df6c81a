//! Chat rendering of multi-turn episodes (ECHO-2 App. F, Eq. 15–19): the conversation
//! `[system, user, assistant, user, …]` becomes the token stream the model reads, built
//! incrementally so that generation can carry its KV cache from turn to turn.
//!
//! **Templates.** A Hugging Face folder's `chat_template` (from `tokenizer_config.json`) is
//! rendered with `minijinja` — the renderer of Hugging Face's Rust serving stack — with the
//! settings `transformers` uses (`trim_blocks`, `lstrip_blocks`, Python string methods,
//! `raise_exception`). A Hugging Face tokenizer with ChatML tokens but no template file gets
//! the ChatML template. The embedded byte model has a small built-in template:
//! `BOS [system "\n"] user SEP assistant EOS user SEP …` (a user turn ends with SEP, an
//! assistant turn with EOS), whose one-message form is the single-turn prompt template
//! `BOS prompt SEP`. Single-turn tasks keep that prompt template ([`Template::Prompt`]), so
//! their records are what they were.
//!
//! **Incremental rendering.** [`Chat::open`] renders the system and first user message with
//! the generation prompt. After an assistant turn, [`Chat::next_user`] renders the whole
//! conversation with the assistant's content replaced by a sentinel and keeps what follows
//! the sentinel — the end of the assistant turn, the next user message and the next
//! generation prompt — so templates that rewrite earlier turns (e.g. Qwen3 dropping old
//! reasoning) still give a suffix of exactly what the model has already read. If the
//! assistant stopped with a stop token whose text starts that suffix, the text is dropped
//! (the model wrote it). Each piece is tokenized on its own: the trajectory is the
//! concatenation, on the worker and in the learner's replay alike.
//!
//! **Actions.** A multi-turn action is strict ([`Chat::action_text`]): the turn must end with
//! a stop token and its other tokens must be the tokenizer's own encoding of their text;
//! anything else is no action (the environment's illegal action). This makes the
//! probability of an action the probability of one token sequence, which exact evaluation
//! reads from the model's log-probs.
//!
//! **Masks** (Eq. 18–19): [`assistant_mask`] marks the sampled tokens of the trajectory —
//! the tokens between a turn's generation prompt and its stop token, inclusive — from the
//! episode's segments; [`turn_index`] and [`response_mask`] are Eq. 18–19 literally, on a
//! full token sequence with a turn-start token. Eq. 19's mask also covers the template's
//! `assistant\n` header and the newline after each turn, which the model does not sample.

use std::collections::BTreeMap;
use std::path::Path;

use minijinja::value::Value;

use crate::error::{PolicyError, Result};
use crate::tokenizer::{ByteTokenizer, Tokenizer};

/// Who speaks a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
        }
    }
}

/// The assistant content placeholder of [`Chat::next_user`] (control characters no
/// tokenizer's text and no environment's observation contains).
const SENTINEL: &str = "\u{1}echo-swarm:assistant-turn\u{1}";

/// The ChatML template (Qwen's format without a default system message), for Hugging Face
/// tokenizers that have `<|im_start|>` / `<|im_end|>` but no `chat_template`.
pub const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// How a conversation becomes text or tokens.
#[derive(Debug)]
pub enum Template {
    /// The tokenizer's single-turn prompt template ([`Tokenizer::encode_prompt`]): one user
    /// message, no system message, no second turn.
    Prompt,
    /// The embedded byte model's chat template (see the module docs).
    Builtin,
    /// A Jinja chat template.
    Jinja(Box<JinjaTemplate>),
}

/// A compiled Jinja chat template with the special-token strings it may reference.
pub struct JinjaTemplate {
    env: minijinja::Environment<'static>,
    source: String,
    bos: String,
    eos: String,
}

impl std::fmt::Debug for JinjaTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JinjaTemplate").finish_non_exhaustive()
    }
}

impl JinjaTemplate {
    /// Compiles `source`; `bos` / `eos` are the strings bound to `bos_token` / `eos_token`.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self> {
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        // Templates that print today's date must render the same on every node.
        env.add_function("strftime_now", |_fmt: String| "01 Jan 2026".to_string());
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| PolicyError::Tokenizer(format!("chat template does not compile: {e}")))?;
        Ok(JinjaTemplate {
            env,
            source: source.to_string(),
            bos: bos.into(),
            eos: eos.into(),
        })
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`, with the assistant generation prompt when asked.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let msgs: Vec<Value> = messages
            .iter()
            .map(|m| {
                let mut o = BTreeMap::new();
                o.insert("role".to_string(), Value::from(m.role.as_str()));
                o.insert("content".to_string(), Value::from(m.content.clone()));
                Value::from(o)
            })
            .collect();
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| PolicyError::Tokenizer(e.to_string()))?;
        tmpl.render(minijinja::context! {
            messages => msgs,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos.clone(),
            eos_token => self.eos.clone(),
        })
        .map_err(|e| PolicyError::Tokenizer(format!("chat template: {e}")))
    }
}

/// The chat template of a Hugging Face folder: `chat_template` of `tokenizer_config.json`
/// (a string, or the `default` entry of a list of named templates), with its `bos_token` and
/// `eos_token` strings. `None` when the folder has no template.
pub fn hf_chat_template(dir: &Path) -> Result<Option<JinjaTemplate>> {
    let path = dir.join("tokenizer_config.json");
    let Ok(bytes) = std::fs::read(&path) else {
        return Ok(None);
    };
    let json: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| PolicyError::CorruptFile {
            path: path.clone(),
            reason: e.to_string(),
        })?;
    let source = match json.get("chat_template") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_string))
            .ok_or_else(|| PolicyError::CorruptFile {
                path: path.clone(),
                reason: "chat_template list has no `default` entry".into(),
            })?,
        _ => return Ok(None),
    };
    let token = |key: &str| -> String {
        match json.get(key) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(v) => v
                .get("content")
                .and_then(|c| c.as_str())
                .unwrap_or_default()
                .to_string(),
            None => String::new(),
        }
    };
    JinjaTemplate::new(&source, &token("bos_token"), &token("eos_token"))
        .map(Some)
        .map_err(|e| PolicyError::CorruptFile {
            path,
            reason: e.to_string(),
        })
}

/// A tokenizer with the template that renders its conversations.
#[derive(Debug)]
pub struct Chat {
    tokenizer: Tokenizer,
    template: Template,
}

impl Chat {
    pub fn new(tokenizer: Tokenizer, template: Template) -> Self {
        Chat {
            tokenizer,
            template,
        }
    }

    /// The chat of a model: the single-turn prompt template unless `multi_turn`; otherwise
    /// the built-in template for the byte tokenizer (a folder's template must then be its
    /// Jinja form, [`ByteTokenizer::CHAT_TEMPLATE`], which exports write), else `hf` (a
    /// folder's template), else ChatML for a tokenizer with ChatML tokens. Errors for a
    /// Hugging Face tokenizer with neither a template nor ChatML tokens.
    pub fn for_model(
        tokenizer: Tokenizer,
        hf: Option<JinjaTemplate>,
        multi_turn: bool,
    ) -> Result<Self> {
        let template = match (multi_turn, hf, &tokenizer) {
            (false, _, _) => Template::Prompt,
            // The byte tokenizer never parses special tokens out of text, so it renders its
            // template natively; another template would mean other ids than it was trained on.
            (true, Some(t), Tokenizer::Byte(_)) if t.source() != ByteTokenizer::CHAT_TEMPLATE => {
                return Err(PolicyError::Tokenizer(
                    "the byte tokenizer renders only its built-in chat template; the folder's \
                     tokenizer_config.json has another `chat_template`"
                        .into(),
                ))
            }
            (true, _, Tokenizer::Byte(_)) => Template::Builtin,
            (true, Some(t), _) => Template::Jinja(Box::new(t)),
            (true, None, t) if t.token_id("<|im_start|>").is_some() => {
                Template::Jinja(Box::new(JinjaTemplate::new(CHATML, "", "<|im_end|>")?))
            }
            (true, None, _) => {
                return Err(PolicyError::Tokenizer(
                    "multi-turn environments need a chat template: the model folder has no \
                     `chat_template` in tokenizer_config.json and no ChatML tokens"
                        .into(),
                ))
            }
        };
        Ok(Chat::new(tokenizer, template))
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn template(&self) -> &Template {
        &self.template
    }

    /// The ids that end an assistant turn.
    pub fn stop_tokens(&self) -> Vec<u32> {
        self.tokenizer.eos_ids()
    }

    /// The first prompt: the system message (if any) and the first user message, then the
    /// generation prompt.
    pub fn open(&self, system: Option<&str>, user: &str) -> Result<Vec<u32>> {
        match &self.template {
            Template::Prompt => {
                if system.is_some() {
                    return Err(PolicyError::Tokenizer(
                        "the single-turn prompt template has no system message".into(),
                    ));
                }
                self.tokenizer.encode_prompt(user)
            }
            Template::Builtin => {
                let mut ids = vec![ByteTokenizer::BOS];
                if let Some(s) = system {
                    ids.extend(self.tokenizer.encode(s)?);
                    ids.push(u32::from(b'\n'));
                }
                ids.extend(self.tokenizer.encode(user)?);
                ids.push(ByteTokenizer::SEP);
                Ok(ids)
            }
            Template::Jinja(t) => {
                let mut msgs = Vec::with_capacity(2);
                if let Some(s) = system {
                    msgs.push(Message::new(Role::System, s));
                }
                msgs.push(Message::new(Role::User, user));
                self.tokenizer.encode(&t.render(&msgs, true)?)
            }
        }
    }

    /// The tokens that follow an assistant turn: the end of that turn (unless the model
    /// wrote it: `stop` is the stop token it ended with, `None` for a turn cut off by its
    /// budget), the next user message and the generation prompt. `history` is the whole
    /// conversation so far, ending with the assistant message.
    pub fn next_user(
        &self,
        history: &[Message],
        stop: Option<u32>,
        user: &str,
    ) -> Result<Vec<u32>> {
        match &self.template {
            Template::Prompt => Err(PolicyError::Tokenizer(
                "the single-turn prompt template has no second turn".into(),
            )),
            Template::Builtin => {
                let mut ids = Vec::with_capacity(user.len() + 2);
                if stop.is_none() {
                    ids.push(ByteTokenizer::EOS);
                }
                ids.extend(self.tokenizer.encode(user)?);
                ids.push(ByteTokenizer::SEP);
                Ok(ids)
            }
            Template::Jinja(t) => {
                let Some((last, earlier)) = history.split_last() else {
                    return Err(PolicyError::Tokenizer("empty conversation".into()));
                };
                if last.role != Role::Assistant {
                    return Err(PolicyError::Tokenizer(
                        "the conversation must end with the assistant's turn".into(),
                    ));
                }
                let mut msgs = earlier.to_vec();
                msgs.push(Message::new(Role::Assistant, SENTINEL));
                msgs.push(Message::new(Role::User, user));
                let text = t.render(&msgs, true)?;
                let mut parts = text.split(SENTINEL);
                let (_, tail) = (parts.next(), parts.next());
                let tail = match (tail, parts.next()) {
                    (Some(tail), None) => tail,
                    _ => {
                        return Err(PolicyError::Tokenizer(
                            "the chat template does not render assistant content verbatim".into(),
                        ))
                    }
                };
                let written = stop.and_then(|s| self.tokenizer.token_text(s));
                let tail = match written {
                    Some(w) if !w.is_empty() => tail.strip_prefix(w.as_str()).unwrap_or(tail),
                    _ => tail,
                };
                self.tokenizer.encode(tail)
            }
        }
    }

    /// The action of a turn of sampled `tokens` (see the module docs): `Some(text)` when the
    /// turn ended with a stop token and the rest is the tokenizer's encoding of `text`.
    pub fn action_text(&self, tokens: &[u32]) -> Result<Option<String>> {
        let stops = self.stop_tokens();
        let Some((last, content)) = tokens.split_last() else {
            return Ok(None);
        };
        if !stops.contains(last) {
            return Ok(None);
        }
        let text = self.tokenizer.decode(content)?;
        Ok((self.tokenizer.encode(&text)? == content).then_some(text))
    }

    /// The tokens of action `text` as the model writes it: its encoding and the first stop
    /// token (scripted play and exact evaluation).
    pub fn action_tokens(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.tokenizer.encode(text)?;
        ids.extend(self.stop_tokens().first());
        Ok(ids)
    }
}

/// A run of one speaker's tokens in an episode's trajectory (the tokens after the first
/// prompt): the assistant's sampled tokens, or an observation (the template's end of the
/// assistant turn, the next user message and generation prompt).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub assistant: bool,
    pub len: usize,
}

/// The turn-aware loss mask (ECHO-2 Eq. 18–19, on segments): 1 on the assistant's tokens,
/// 0 on observations. A pure function of the segments, which replay derives from the
/// tokens, the environment and the budgets.
pub fn assistant_mask(segments: &[Segment]) -> Vec<u8> {
    segments
        .iter()
        .flat_map(|s| std::iter::repeat_n(u8::from(s.assistant), s.len))
        .collect()
}

/// Eq. 18: the chat-turn index c_t = Σ_{k ≤ t} 𝟙[x_k = τ_start] of every token.
pub fn turn_index(tokens: &[u32], turn_start: u32) -> Vec<usize> {
    tokens
        .iter()
        .scan(0usize, |c, &t| {
            *c += usize::from(t == turn_start);
            Some(*c)
        })
        .collect()
}

/// Eq. 19: m_t = 𝟙[c_t > 1] · 𝟙[c_t mod 2 = 1] — the tokens of assistant turns after the
/// system prompt, for a conversation that starts `[system, user, assistant, user, …]`.
pub fn response_mask(tokens: &[u32], turn_start: u32) -> Vec<u8> {
    turn_index(tokens, turn_start)
        .into_iter()
        .map(|c| u8::from(c > 1 && c % 2 == 1))
        .collect()
}

#[cfg(test)]
#[path = "chat_tests.rs"]
mod tests;
