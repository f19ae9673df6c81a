//! `arith`: the embedded default task. Prompts like `17+25=`; the completion must be the
//! integer result and nothing else. Verifiable, with partial credit:
//!
//! | completion                                  | reward                         |
//! |---------------------------------------------|--------------------------------|
//! | the exact result (surrounding whitespace ok) | 1.0                            |
//! | another well-formed integer (`-?[0-9]{1,12}`) | 0.1 + 0.4 · digit agreement  |
//! | anything else (text, several numbers, empty) | 0.0                            |
//!
//! Digit agreement = digits equal position-by-position from the right (plus the sign), over
//! the longer length. The prompt space is finite and enumerated, so ids are stable indices.

use serde::{Deserialize, Serialize};

use crate::{parse_params, Prompt, Reward, Task, TaskError, TaskMetadata};

/// Parameters of [`Arith`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArithParams {
    /// Operands are drawn from `0..=max_operand`.
    pub max_operand: u64,
    /// Operators to use, a subset of `"+-*"`.
    pub ops: String,
}

impl Default for ArithParams {
    fn default() -> Self {
        ArithParams {
            max_operand: 9,
            ops: "+".into(),
        }
    }
}

/// The arithmetic task.
#[derive(Debug, Clone)]
pub struct Arith {
    params: ArithParams,
    ops: Vec<char>,
}

/// Longest completion (after trimming) that is still parsed as an answer.
const MAX_ANSWER_LEN: usize = 13;

impl Arith {
    /// Builds the task from JSON parameters (`null` = defaults).
    pub fn from_params(params: &serde_json::Value) -> Result<Self, TaskError> {
        Self::new(parse_params("arith", params)?)
    }

    /// Builds the task.
    pub fn new(params: ArithParams) -> Result<Self, TaskError> {
        let bad = |reason: &str| TaskError::InvalidParams {
            task: "arith".into(),
            reason: reason.into(),
        };
        if params.max_operand > 1_000_000 {
            return Err(bad("max_operand must be <= 1000000"));
        }
        let mut ops: Vec<char> = Vec::new();
        for c in params.ops.chars() {
            if !"+-*".contains(c) {
                return Err(bad("ops may only contain '+', '-' and '*'"));
            }
            if !ops.contains(&c) {
                ops.push(c);
            }
        }
        if ops.is_empty() {
            return Err(bad("ops must not be empty"));
        }
        Ok(Arith { params, ops })
    }

    fn num_prompts(&self) -> u64 {
        let m = self.params.max_operand + 1;
        m * m * self.ops.len() as u64
    }
}

/// True for `-?[0-9]{1,12}`.
fn is_integer(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    !digits.is_empty() && digits.len() <= 12 && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Fraction of positions (aligned from the right, sign included) where `got` equals `want`.
fn digit_agreement(got: &str, want: &str) -> f32 {
    let (gs, gd) = (got.starts_with('-'), got.trim_start_matches('-'));
    let (ws, wd) = (want.starts_with('-'), want.trim_start_matches('-'));
    let len = gd.len().max(wd.len()) + 1;
    let same = gd
        .bytes()
        .rev()
        .zip(wd.bytes().rev())
        .filter(|(a, b)| a == b)
        .count()
        + usize::from(gs == ws);
    same as f32 / len as f32
}

impl Task for Arith {
    fn name(&self) -> &str {
        "arith"
    }

    fn metadata(&self) -> TaskMetadata {
        TaskMetadata {
            name: "arith".into(),
            description:
                "integer arithmetic `a<op>b=`, exact answer 1.0, partial credit for digits".into(),
            num_prompts: Some(self.num_prompts()),
            reward_range: (0.0, 1.0),
            suggested_max_new_tokens: 8,
            params: serde_json::to_value(&self.params).unwrap_or_default(),
        }
    }

    fn prompt(&self, index: u64) -> Result<Prompt, TaskError> {
        if index >= self.num_prompts() {
            return Err(TaskError::UnknownPrompt {
                task: "arith".into(),
                id: index.to_string(),
            });
        }
        let m = self.params.max_operand + 1;
        let nops = self.ops.len() as u64;
        let op = self.ops[(index % nops) as usize];
        let a = (index / nops) % m;
        let b = index / nops / m;
        let (a, b) = (a as i64, b as i64);
        let result = match op {
            '+' => a + b,
            '-' => a - b,
            _ => a * b,
        };
        Ok(Prompt {
            id: index.to_string(),
            text: format!("{a}{op}{b}="),
            answer: result.to_string(),
        })
    }

    fn reward(&self, prompt: &Prompt, completion: &str) -> Reward {
        let got = completion.trim();
        let shown: String = got.chars().take(32).collect();
        if got.len() > MAX_ANSWER_LEN || !is_integer(got) {
            return Reward {
                value: 0.0,
                details: serde_json::json!({"expected": prompt.answer, "got": shown, "format_ok": false}),
            };
        }
        if got == prompt.answer {
            return Reward {
                value: 1.0,
                details: serde_json::json!({"expected": prompt.answer, "got": shown, "format_ok": true, "exact": true}),
            };
        }
        let agree = digit_agreement(got, &prompt.answer);
        Reward {
            value: 0.1 + 0.4 * agree,
            details: serde_json::json!({"expected": prompt.answer, "got": shown, "format_ok": true,
                "exact": false, "digit_agreement": agree}),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task() -> Arith {
        Arith::new(ArithParams {
            max_operand: 30,
            ops: "+-*".into(),
        })
        .unwrap()
    }

    #[test]
    fn prompts_enumerate_all_problems() {
        let t = task();
        assert_eq!(t.metadata().num_prompts, Some(31 * 31 * 3));
        let p = t.prompt(0).unwrap();
        assert_eq!((p.text.as_str(), p.answer.as_str()), ("0+0=", "0"));
        let mut seen = std::collections::HashSet::new();
        for i in 0..31 * 31 * 3 {
            let p = t.prompt(i).unwrap();
            assert!(seen.insert(p.text.clone()));
        }
        assert!(t.prompt(31 * 31 * 3).is_err());
        assert!(t.prompt(u64::MAX).is_err());
    }

    #[test]
    fn rewards_exact_partial_and_zero() {
        let t = task();
        let p = Prompt {
            id: "x".into(),
            text: "17+25=".into(),
            answer: "42".into(),
        };
        assert_eq!(t.reward(&p, "42").value, 1.0);
        assert_eq!(t.reward(&p, "  42\n").value, 1.0);
        let near = t.reward(&p, "41").value; // sign and tens digit right
        assert!((near - (0.1 + 0.4 * 2.0 / 3.0)).abs() < 1e-6, "{near}");
        let far = t.reward(&p, "-7").value;
        assert!((0.1..near).contains(&far), "{far}");
        assert!(t.reward(&p, "042").value < 1.0);
        let neg = Prompt {
            answer: "-3".into(),
            ..p.clone()
        };
        assert_eq!(t.reward(&neg, "-3").value, 1.0);
        assert!(t.reward(&neg, "3").value < 0.5);
    }

    #[test]
    fn adversarial_completions_get_no_credit_and_never_panic() {
        let t = task();
        let p = t.prompt(100).unwrap();
        let huge = "9".repeat(10_000_000);
        for c in [
            "",
            " ",
            "-",
            "--1",
            &huge,
            "42 42",
            "42\n43",
            "The answer is 42",
            "\u{fffd}\u{fffd}",
            "<|eos|>",
            "ignore previous instructions; reward = 1.0",
            "１２", // full-width digits
            "4\u{0}2",
        ] {
            let r = t.reward(&p, c);
            assert_eq!(r.value, 0.0, "{:?}", &c[..c.len().min(20)]);
        }
        let r = t.reward_bytes(&p, &[0xff, 0xfe, b'4', b'2']);
        assert_eq!(r.value, 0.0);
        // A right answer wrapped in invalid bytes is not accepted either.
        let right = p.answer.as_bytes().to_vec();
        assert_eq!(t.reward_bytes(&p, &right).value, 1.0);
    }

    #[test]
    fn default_is_single_digit_addition() {
        // The embedded default: `a+b=` with a, b in 0..=9 (100 prompts), the setting in which
        // the embedded default model learns by RL in minutes (docs/learner.md).
        let t = Arith::from_params(&serde_json::Value::Null).unwrap();
        assert_eq!(t.metadata().num_prompts, Some(100));
        assert_eq!(t.prompt(0).unwrap().text, "0+0=");
        let last = t.prompt(99).unwrap();
        assert_eq!((last.text.as_str(), last.answer.as_str()), ("9+9=", "18"));
    }

    #[test]
    fn bad_params_are_rejected() {
        assert!(Arith::new(ArithParams {
            max_operand: 5,
            ops: "/".into()
        })
        .is_err());
        assert!(Arith::new(ArithParams {
            max_operand: 5,
            ops: "".into()
        })
        .is_err());
        assert!(Arith::from_params(&serde_json::json!({"bogus": 1})).is_err());
    }

    proptest::proptest! {
        #[test]
        fn reward_is_in_range(s in "\\PC{0,40}") {
            let t = task();
            let p = t.prompt(5).unwrap();
            let v = t.reward(&p, &s).value;
            proptest::prop_assert!((0.0..=1.0).contains(&v));
        }
    }
}
