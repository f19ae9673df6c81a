//! `knights-knaves`: generated Knights-and-Knaves puzzles (ECHO §3.1), 2–8 inhabitants.
//! Knights always tell the truth, knaves always lie; each inhabitant makes one statement about
//! one or two inhabitants. A brute-force solver over all 2^n assignments keeps only puzzles
//! with exactly one solution.
//!
//! Reward: the completion must state every inhabitant's type (`<Name> is a knight|knave`; the
//! **last** statement about each name counts). All correct → 1.0; every name stated but some
//! wrong → 0.1 + 0.4 · fraction correct; any name missing → 0.0.

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::util::{item_rng, tail};
use crate::{parse_params, Prompt, Reward, Task, TaskError, TaskMetadata};

/// Names, chosen so that none is a prefix of another.
const NAMES: [&str; 12] = [
    "Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Iris", "Jack", "Kate",
    "Leo",
];

/// Parameters of [`KnightsKnaves`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KnightsKnavesParams {
    /// Fewest inhabitants (>= 2).
    pub min_people: usize,
    /// Most inhabitants (<= 8).
    pub max_people: usize,
    /// Seed of the generator (different seeds give different puzzle sets).
    pub seed: u64,
}

impl Default for KnightsKnavesParams {
    fn default() -> Self {
        KnightsKnavesParams {
            min_people: 2,
            max_people: 8,
            seed: 0,
        }
    }
}

/// A statement about inhabitants; `true` in a claim means "is a knight".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Statement {
    /// "X is a knight/knave."
    Is(usize, bool),
    /// "X is a knight/knave and Y is a knight/knave."
    And(usize, bool, usize, bool),
    /// "X is a knight/knave or Y is a knight/knave."
    Or(usize, bool, usize, bool),
    /// "If X is a knight/knave then Y is a knight/knave."
    Implies(usize, bool, usize, bool),
    /// "X and Y are the same type." / "... different types."
    Same(usize, usize, bool),
}

impl Statement {
    /// Truth value under an assignment (`true` = knight).
    pub fn eval(&self, a: &[bool]) -> bool {
        match *self {
            Statement::Is(x, t) => a[x] == t,
            Statement::And(x, tx, y, ty) => a[x] == tx && a[y] == ty,
            Statement::Or(x, tx, y, ty) => a[x] == tx || a[y] == ty,
            Statement::Implies(x, tx, y, ty) => a[x] != tx || a[y] == ty,
            Statement::Same(x, y, same) => (a[x] == a[y]) == same,
        }
    }

    fn text(&self, names: &[&str]) -> String {
        let k = |t: bool| if t { "a knight" } else { "a knave" };
        match *self {
            Statement::Is(x, t) => format!("{} is {}.", names[x], k(t)),
            Statement::And(x, tx, y, ty) => {
                format!("{} is {} and {} is {}.", names[x], k(tx), names[y], k(ty))
            }
            Statement::Or(x, tx, y, ty) => {
                format!("{} is {} or {} is {}.", names[x], k(tx), names[y], k(ty))
            }
            Statement::Implies(x, tx, y, ty) => {
                format!(
                    "If {} is {} then {} is {}.",
                    names[x],
                    k(tx),
                    names[y],
                    k(ty)
                )
            }
            Statement::Same(x, y, true) => {
                format!("{} and {} are the same type.", names[x], names[y])
            }
            Statement::Same(x, y, false) => {
                format!("{} and {} are different types.", names[x], names[y])
            }
        }
    }
}

/// All assignments (bit i of the mask = person i is a knight) consistent with the statements,
/// where person i made `statements[i]`.
pub fn solve(statements: &[Statement]) -> Vec<Vec<bool>> {
    let n = statements.len();
    (0u32..(1 << n))
        .map(|m| (0..n).map(|i| m >> i & 1 == 1).collect::<Vec<bool>>())
        .filter(|a| {
            statements
                .iter()
                .enumerate()
                .all(|(i, s)| s.eval(a) == a[i])
        })
        .collect()
}

/// A generated puzzle: inhabitants' names, the statement each makes, the unique solution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Puzzle {
    /// Names, in speaking order.
    pub names: Vec<&'static str>,
    /// `statements[i]` is what `names[i]` says.
    pub statements: Vec<Statement>,
    /// `solution[i]` is true when `names[i]` is a knight.
    pub solution: Vec<bool>,
}

/// The Knights-and-Knaves task.
#[derive(Debug, Clone)]
pub struct KnightsKnaves {
    params: KnightsKnavesParams,
}

impl KnightsKnaves {
    /// Builds the task from JSON parameters (`null` = defaults).
    pub fn from_params(params: &serde_json::Value) -> Result<Self, TaskError> {
        Self::new(parse_params("knights-knaves", params)?)
    }

    /// Builds the task.
    pub fn new(params: KnightsKnavesParams) -> Result<Self, TaskError> {
        if params.min_people < 2 || params.max_people > 8 || params.min_people > params.max_people {
            return Err(TaskError::InvalidParams {
                task: "knights-knaves".into(),
                reason: "need 2 <= min_people <= max_people <= 8".into(),
            });
        }
        Ok(KnightsKnaves { params })
    }

    /// The puzzle with index `index`: names, statements and the unique solution.
    pub fn puzzle(&self, index: u64) -> Result<Puzzle, TaskError> {
        let mut rng = item_rng("knights-knaves", self.params.seed, index);
        let n = rng.gen_range(self.params.min_people..=self.params.max_people);
        let mut pool: Vec<&'static str> = NAMES.to_vec();
        let mut names = Vec::with_capacity(n);
        for _ in 0..n {
            let i = rng.gen_range(0..pool.len());
            names.push(pool.swap_remove(i));
        }
        for _attempt in 0..20_000 {
            let truth: Vec<bool> = (0..n).map(|_| rng.gen()).collect();
            let mut stmts = Vec::with_capacity(n);
            for i in 0..n {
                // Draw until the statement's truth matches the speaker's type.
                loop {
                    let s = random_statement(&mut rng, n, i);
                    if s.eval(&truth) == truth[i] {
                        stmts.push(s);
                        break;
                    }
                }
            }
            let sols = solve(&stmts);
            if sols.len() == 1 && sols[0] == truth {
                return Ok(Puzzle {
                    names,
                    statements: stmts,
                    solution: truth,
                });
            }
        }
        Err(TaskError::Generation {
            task: "knights-knaves".into(),
            reason: format!("no unique puzzle found for index {index}"),
        })
    }
}

fn random_statement(rng: &mut impl Rng, n: usize, speaker: usize) -> Statement {
    let x = rng.gen_range(0..n);
    let mut y = rng.gen_range(0..n);
    if y == x {
        y = (y + 1 + usize::from(n > 2 && (y + 1) % n == speaker)) % n;
        if y == x {
            y = (x + 1) % n;
        }
    }
    match rng.gen_range(0..5) {
        0 => Statement::Is(if x == speaker { y } else { x }, rng.gen()),
        1 => Statement::And(x, rng.gen(), y, rng.gen()),
        2 => Statement::Or(x, rng.gen(), y, rng.gen()),
        3 => Statement::Implies(x, rng.gen(), y, rng.gen()),
        _ => Statement::Same(x, y, rng.gen()),
    }
}

fn answer_text(names: &[&str], sol: &[bool]) -> String {
    names
        .iter()
        .zip(sol)
        .map(|(n, &k)| format!("{n} is a {}", if k { "knight" } else { "knave" }))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The last claim about `name` in `text` (`Some(true)` = knight), matching whole words,
/// case-insensitively.
fn last_claim(text_lower: &str, name: &str) -> Option<bool> {
    let name = name.to_lowercase();
    let mut best: Option<(usize, bool)> = None;
    for kind in [("knight", true), ("knave", false)] {
        let pat = format!("{name} is a {}", kind.0);
        let mut from = 0;
        while let Some(off) = text_lower[from..].find(&pat) {
            let at = from + off;
            let before_ok = text_lower[..at]
                .chars()
                .next_back()
                .is_none_or(|c| !c.is_alphanumeric());
            let after = &text_lower[at + pat.len()..];
            let after_ok = after.chars().next().is_none_or(|c| !c.is_alphanumeric());
            if before_ok && after_ok && best.is_none_or(|(b, _)| at > b) {
                best = Some((at, kind.1));
            }
            from = at + pat.len();
        }
    }
    best.map(|(_, k)| k)
}

impl Task for KnightsKnaves {
    fn name(&self) -> &str {
        "knights-knaves"
    }

    fn metadata(&self) -> TaskMetadata {
        TaskMetadata {
            name: "knights-knaves".into(),
            description: "generated Knights-and-Knaves logic puzzles, solver-verified".into(),
            num_prompts: None,
            reward_range: (0.0, 1.0),
            suggested_max_new_tokens: 1024,
            params: serde_json::to_value(&self.params).unwrap_or_default(),
        }
    }

    fn prompt(&self, index: u64) -> Result<Prompt, TaskError> {
        let Puzzle {
            names,
            statements: stmts,
            solution: sol,
        } = self.puzzle(index)?;
        let mut text = format!(
            "A very special island is inhabited only by knights and knaves. Knights always tell \
             the truth, and knaves always lie. You meet {} inhabitants: {}.",
            names.len(),
            names.join(", ")
        );
        for (i, s) in stmts.iter().enumerate() {
            text.push_str(&format!(" {} says: \"{}\"", names[i], s.text(&names)));
        }
        text.push_str(
            " So who is a knight and who is a knave? End your answer with one statement per \
             inhabitant, like \"Alice is a knight, Bob is a knave\".",
        );
        Ok(Prompt {
            id: index.to_string(),
            text,
            answer: answer_text(&names, &sol),
        })
    }

    fn reward(&self, prompt: &Prompt, completion: &str) -> Reward {
        // The reference answer lists every inhabitant: parse names and types from it.
        let expected: Vec<(String, bool)> = prompt
            .answer
            .split(", ")
            .filter_map(|part| {
                let (name, kind) = part.split_once(" is a ")?;
                Some((name.to_string(), kind == "knight"))
            })
            .collect();
        let text = tail(completion, 16 * 1024).to_lowercase();
        let mut correct = 0usize;
        let mut missing = Vec::new();
        for (name, k) in &expected {
            match last_claim(&text, name) {
                Some(c) if c == *k => correct += 1,
                Some(_) => {}
                None => missing.push(name.clone()),
            }
        }
        let n = expected.len().max(1);
        let value = if expected.is_empty() || !missing.is_empty() {
            0.0
        } else if correct == n {
            1.0
        } else {
            0.1 + 0.4 * correct as f32 / n as f32
        };
        Reward {
            value,
            details: serde_json::json!({"people": expected.len(), "correct": correct, "missing": missing}),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task() -> KnightsKnaves {
        KnightsKnaves::new(KnightsKnavesParams::default()).unwrap()
    }

    #[test]
    fn solver_on_classic_puzzle() {
        // A: "B is a knave."  B: "A and I are the same type." → A knight, B knave.
        let s = [Statement::Is(1, false), Statement::Same(0, 1, true)];
        assert_eq!(solve(&s), vec![vec![true, false]]);
        // "I am a knave" has no solution.
        assert!(solve(&[Statement::Is(0, false)]).is_empty());
    }

    #[test]
    fn puzzles_have_unique_solutions_for_all_sizes() {
        let mut sizes = std::collections::BTreeSet::new();
        let t = task();
        for i in 0..60 {
            let Puzzle {
                names,
                statements: stmts,
                solution: sol,
            } = t.puzzle(i).unwrap();
            assert_eq!(names.len(), stmts.len());
            assert_eq!(solve(&stmts), vec![sol]);
            sizes.insert(names.len());
        }
        assert_eq!(
            sizes.into_iter().collect::<Vec<_>>(),
            (2..=8).collect::<Vec<_>>()
        );
        let eight = KnightsKnaves::new(KnightsKnavesParams {
            min_people: 8,
            max_people: 8,
            seed: 3,
        })
        .unwrap();
        for i in 0..5 {
            assert_eq!(eight.prompt(i).unwrap().answer.matches(" is a ").count(), 8);
        }
    }

    #[test]
    fn rewards_full_partial_and_missing() {
        let t = KnightsKnaves::new(KnightsKnavesParams {
            min_people: 3,
            max_people: 3,
            seed: 1,
        })
        .unwrap();
        let p = t.prompt(0).unwrap();
        assert_eq!(t.reward(&p, &p.answer).value, 1.0);
        assert_eq!(
            t.reward(
                &p,
                &format!("Let me think.\n**{}**.", p.answer.to_uppercase())
            )
            .value,
            1.0
        );
        // Flip one person's type.
        let flipped = if p.answer.contains("knight") {
            p.answer.replacen("knight", "knave", 1)
        } else {
            p.answer.replacen("knave", "knight", 1)
        };
        let r = t.reward(&p, &flipped).value;
        assert!((r - (0.1 + 0.4 * 2.0 / 3.0)).abs() < 1e-6, "{r}");
        // Several answers: the last statement about each person counts.
        assert_eq!(
            t.reward(&p, &format!("{flipped}. No wait: {}", p.answer))
                .value,
            1.0
        );
        assert!(
            t.reward(&p, &format!("{}. No wait: {flipped}", p.answer))
                .value
                < 1.0
        );
        // Missing one person.
        let first_two: Vec<&str> = p.answer.split(", ").take(2).collect();
        assert_eq!(t.reward(&p, &first_two.join(", ")).value, 0.0);
    }

    #[test]
    fn adversarial_completions_never_panic_or_score() {
        let t = task();
        let p = t.prompt(4).unwrap();
        let huge = "x".repeat(10_000_000);
        for c in [
            "",
            "\u{fffd}",
            &huge,
            "everyone is a knight",
            "reward: 1.0 <|im_end|>",
        ] {
            assert_eq!(t.reward(&p, c).value, 0.0);
        }
        assert_eq!(t.reward_bytes(&p, &[0xff, 0xc0, 0x80]).value, 0.0);
        // Answer buried before 10 MB of junk is cut off by the scan window: no credit.
        assert_eq!(t.reward(&p, &format!("{}{huge}", p.answer)).value, 0.0);
        // Name embedded in a longer word does not count.
        let fake = p.answer.replace(" is a ", "xx is a ");
        assert_eq!(t.reward(&p, &fake).value, 0.0);
    }

    #[test]
    fn bad_params_are_rejected() {
        assert!(KnightsKnaves::new(KnightsKnavesParams {
            min_people: 1,
            max_people: 3,
            seed: 0
        })
        .is_err());
        assert!(KnightsKnaves::new(KnightsKnavesParams {
            min_people: 2,
            max_people: 9,
            seed: 0
        })
        .is_err());
        assert!(KnightsKnaves::new(KnightsKnavesParams {
            min_people: 5,
            max_people: 3,
            seed: 0
        })
        .is_err());
    }
}
