use super::*;

/// GPT-2's byte-to-unicode map: the vocabulary of a byte-level BPE without merges.
fn byte_chars() -> Vec<char> {
    let mut bs: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut out = vec![' '; 256];
    for (b, c) in bs.iter().zip(cs) {
        out[*b as usize] = char::from_u32(c).unwrap();
    }
    out
}

/// A byte-level tokenizer with Qwen's special tokens: any text encodes, one token a byte.
pub(crate) fn qwen_like_tokenizer() -> Tokenizer {
    let mut vocab = serde_json::Map::new();
    for (i, c) in byte_chars().into_iter().enumerate() {
        vocab.insert(c.to_string(), i.into());
    }
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    let added: Vec<serde_json::Value> = specials
        .iter()
        .enumerate()
        .map(|(i, s)| {
            vocab.insert(s.to_string(), (256 + i).into());
            serde_json::json!({"id": 256 + i, "content": s, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": []}
    });
    let inner = tokenizers::Tokenizer::from_bytes(json.to_string().as_bytes()).unwrap();
    Tokenizer::from_hf(inner, &[])
}

/// Qwen2.5-Instruct's chat template, as its tokenizer_config.json ships it.
pub(crate) const QWEN25: &str = r#"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;

fn conversation() -> Vec<Message> {
    vec![
        Message::new(Role::System, "Kuhn poker."),
        Message::new(Role::User, "Card: K. check or bet?"),
        Message::new(Role::Assistant, "bet"),
        Message::new(Role::User, "Opponent calls."),
    ]
}

#[test]
fn a_qwen_template_renders_the_expected_string() {
    let t = JinjaTemplate::new(QWEN25, "", "<|im_end|>").unwrap();
    assert_eq!(
        t.render(&conversation(), true).unwrap(),
        "<|im_start|>system\nKuhn poker.<|im_end|>\n<|im_start|>user\nCard: K. check or bet?<|im_end|>\n\
         <|im_start|>assistant\nbet<|im_end|>\n<|im_start|>user\nOpponent calls.<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    // Without a system message Qwen2.5 adds its default one; without the generation prompt
    // the text ends after the last message.
    let plain = t.render(&conversation()[1..2], false).unwrap();
    assert!(
        plain.starts_with("<|im_start|>system\nYou are Qwen"),
        "{plain}"
    );
    assert!(plain.ends_with("check or bet?<|im_end|>\n"), "{plain}");
    // Python string methods and raise_exception work.
    let py = JinjaTemplate::new(
        "{{ messages[0].content.strip().upper() }}{% if messages|length > 1 %}{{ raise_exception('one message only') }}{% endif %}",
        "",
        "",
    )
    .unwrap();
    assert_eq!(
        py.render(&[Message::new(Role::User, "  hi ")], false)
            .unwrap(),
        "HI"
    );
    let e = py.render(&conversation(), false).unwrap_err();
    assert!(e.to_string().contains("one message only"), "{e}");
    assert!(JinjaTemplate::new("{% if %}", "", "").is_err());
}

#[test]
fn incremental_rendering_is_the_full_rendering_tokenized_in_pieces() {
    let tok = qwen_like_tokenizer();
    let t = JinjaTemplate::new(QWEN25, "", "<|im_end|>").unwrap();
    let full = t.render(&conversation(), true).unwrap();
    let chat = Chat::for_model(tok.clone(), Some(t), true).unwrap();
    let im_end = tok.token_id("<|im_end|>").unwrap();
    let mut ids = chat
        .open(Some("Kuhn poker."), "Card: K. check or bet?")
        .unwrap();
    let sampled = chat.action_tokens("bet").unwrap();
    assert_eq!(
        sampled.last(),
        Some(&im_end),
        "the first stop token ends an action"
    );
    ids.extend(&sampled);
    let obs = chat
        .next_user(&conversation()[..3], Some(im_end), "Opponent calls.")
        .unwrap();
    ids.extend(&obs);
    // The model read exactly the template's rendering of the conversation.
    assert_eq!(
        tok.decode(&ids).unwrap(),
        full.replace("<|im_start|>", "").replace("<|im_end|>", "")
    );
    let specials = |x: &[u32]| x.iter().filter(|&&i| i >= 256).count();
    assert_eq!(specials(&ids), specials(&tok.encode(&full).unwrap()));
    assert_eq!(
        ids,
        tok.encode(&full).unwrap(),
        "byte-level pieces concatenate to the whole"
    );
    // A turn cut off by its budget is closed by the template.
    let cut = chat.next_user(&conversation()[..3], None, "x").unwrap();
    assert_eq!(cut.first(), Some(&im_end));
    assert_eq!(
        &cut[1..],
        &chat
            .next_user(&conversation()[..3], Some(im_end), "x")
            .unwrap()[..]
    );
}

#[test]
fn actions_are_strict_token_sequences() {
    let chat = Chat::for_model(Tokenizer::byte(), None, true).unwrap();
    let bet = chat.action_tokens("bet").unwrap();
    assert_eq!(bet, vec![98, 101, 116, ByteTokenizer::EOS]);
    assert_eq!(chat.action_text(&bet).unwrap().as_deref(), Some("bet"));
    // No stop token (cut off), a special token inside, or nothing: no action.
    assert_eq!(chat.action_text(&bet[..3]).unwrap(), None);
    let smuggled = [98, ByteTokenizer::SEP, 101, 116, ByteTokenizer::EOS];
    assert_eq!(chat.action_text(&smuggled).unwrap(), None);
    assert_eq!(chat.action_text(&[]).unwrap(), None);
    assert_eq!(
        chat.action_text(&[ByteTokenizer::EOS]).unwrap().as_deref(),
        Some("")
    );
}

#[test]
fn the_builtin_template_extends_the_single_turn_prompt() {
    let byte = Tokenizer::byte();
    let chat = Chat::for_model(byte.clone(), None, true).unwrap();
    assert!(matches!(chat.template(), Template::Builtin));
    // One user message: exactly the single-turn prompt template.
    assert_eq!(
        chat.open(None, "1+1=").unwrap(),
        byte.encode_prompt("1+1=").unwrap()
    );
    let with_rules = chat.open(Some("rules"), "go").unwrap();
    assert_eq!(byte.decode(&with_rules).unwrap(), "rules\ngo");
    let h = [Message::new(Role::Assistant, "bet")];
    let after_stop = chat.next_user(&h, Some(ByteTokenizer::EOS), "ok").unwrap();
    assert_eq!(after_stop, vec![111, 107, ByteTokenizer::SEP]);
    let after_cut = chat.next_user(&h, None, "ok").unwrap();
    assert_eq!(
        after_cut,
        vec![ByteTokenizer::EOS, 111, 107, ByteTokenizer::SEP]
    );
    // The single-turn template refuses what it cannot render.
    let single = Chat::for_model(byte, None, false).unwrap();
    assert!(single.open(Some("rules"), "go").is_err());
    assert!(single.next_user(&h, None, "ok").is_err());
    // A Hugging Face tokenizer without a template or ChatML tokens cannot render chats.
    let plain = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": {"<unk>": 0, "go": 1}, "unk_token": "<unk>"}
    });
    let plain = Tokenizer::from_hf(
        tokenizers::Tokenizer::from_bytes(plain.to_string().as_bytes()).unwrap(),
        &[],
    );
    assert!(Chat::for_model(plain, None, true).is_err());
    assert!(
        Chat::for_model(qwen_like_tokenizer(), None, true).is_ok(),
        "ChatML fallback"
    );
}

/// A hand-built byte-template episode: prompt, then [bet EOS][obs SEP][call EOS].
#[test]
fn masks_cover_exactly_the_assistant_tokens() {
    let segs = [
        Segment {
            assistant: true,
            len: 4,
        },
        Segment {
            assistant: false,
            len: 6,
        },
        Segment {
            assistant: true,
            len: 5,
        },
    ];
    let m = assistant_mask(&segs);
    assert_eq!(m, [vec![1; 4], vec![0; 6], vec![1; 5]].concat());
    // Eq. 18–19 on a ChatML rendering: the turn index counts <|im_start|>, and the mask is
    // the odd turns after the system prompt — the sampled tokens plus the template's
    // `assistant\n` header and the newline after <|im_end|>.
    let tok = qwen_like_tokenizer();
    let t = JinjaTemplate::new(QWEN25, "", "<|im_end|>").unwrap();
    let mut msgs = conversation();
    msgs.push(Message::new(Role::Assistant, "call"));
    let text = t.render(&msgs, false).unwrap();
    let ids = tok.encode(&text).unwrap();
    let start = tok.token_id("<|im_start|>").unwrap();
    let c = turn_index(&ids, start);
    assert_eq!(
        *c.last().unwrap(),
        5,
        "system, user, assistant, user, assistant"
    );
    let eq19 = response_mask(&ids, start);
    let covered: String = tok
        .decode(
            &ids.iter()
                .zip(&eq19)
                .filter(|(_, &m)| m == 1)
                .map(|(&i, _)| i)
                .collect::<Vec<_>>(),
        )
        .unwrap();
    assert_eq!(covered, "assistant\nbet\nassistant\ncall\n");
}

/// The Jinja form of the built-in template that exports write (`chat_template`), rendered by
/// minijinja and tokenized by Hugging Face `tokenizers` from the byte tokenizer's
/// `tokenizer.json` (which parses `<|bos|>`, `<|sep|>`, `<|eos|>` as `apply_chat_template`
/// does), gives exactly the ids the built-in renderer feeds the model, turn by turn.
#[test]
fn the_exported_jinja_template_renders_the_builtin_ids() {
    let hf = tokenizers::Tokenizer::from_bytes(ByteTokenizer.to_hf_json().as_bytes()).unwrap();
    let jinja = JinjaTemplate::new(ByteTokenizer::CHAT_TEMPLATE, "<|bos|>", "<|eos|>").unwrap();
    let chat = Chat::for_model(Tokenizer::byte(), None, true).unwrap();
    let conversations: [(Option<&str>, &[&str]); 4] = [
        (None, &["3+4="][..]),
        (
            Some("Kuhn poker. Cards J<Q<K."),
            &["Card: K. check or bet?", "bet", "Opponent calls."],
        ),
        (
            Some("Heads-up Texas Hold'em, blinds 1/2.\nReply with one action."),
            &[
                "Hand: As Kd. Pot: 3.",
                "raise 6",
                "Opponent: call. Board: 2c 7h Jd.",
                "check",
                "Pot: 12?",
                "all-in",
                "done",
            ],
        ),
        (None, &["  spaces and\nnewlines ", "", "héllo ∑ 😀", "x"]),
    ];
    for (system, turns) in conversations {
        let mut messages: Vec<Message> = system
            .into_iter()
            .map(|s| Message::new(Role::System, s))
            .collect();
        messages.push(Message::new(Role::User, turns[0]));
        let mut ids = chat.open(system, turns[0]).unwrap();
        for pair in turns[1..].chunks(2) {
            ids.extend(chat.action_tokens(pair[0]).unwrap());
            messages.push(Message::new(Role::Assistant, pair[0]));
            // The conversation ending with the assistant's turn, as an export's user sees it.
            let text = jinja.render(&messages, false).unwrap();
            assert_eq!(
                hf.encode(text, false).unwrap().get_ids(),
                ids.as_slice(),
                "{messages:?}"
            );
            if let Some(user) = pair.get(1) {
                ids.extend(
                    chat.next_user(&messages, Some(ByteTokenizer::EOS), user)
                        .unwrap(),
                );
                messages.push(Message::new(Role::User, *user));
            }
        }
        let text = jinja.render(&messages, true).unwrap();
        if messages.last().map(|m| m.role) == Some(Role::User) {
            assert_eq!(
                hf.encode(text, false).unwrap().get_ids(),
                ids.as_slice(),
                "{messages:?}"
            );
        }
    }
    // The template refuses what the built-in renderer cannot express.
    let late_system = [
        Message::new(Role::User, "a"),
        Message::new(Role::System, "b"),
    ];
    assert!(jinja.render(&late_system, true).is_err());
    // A byte-tokenizer folder with this template chats with the built-in renderer; with any
    // other template it is refused (the byte tokenizer cannot parse special tokens).
    let c = Chat::for_model(Tokenizer::byte(), Some(jinja), true).unwrap();
    assert!(matches!(c.template(), Template::Builtin));
    let other = JinjaTemplate::new(CHATML, "", "<|im_end|>").unwrap();
    let e = Chat::for_model(Tokenizer::byte(), Some(other), true).unwrap_err();
    assert!(e.to_string().contains("chat_template"), "{e}");
}
