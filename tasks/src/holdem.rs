//! `holdem`: one hand of heads-up Texas Hold'em (limit or no-limit) against a fixed opponent,
//! as in ECHO-2 App. F.6 / Table 7; the metric is the chip change per hand, in big blinds.
//! Cards and the seven-card hand ranking come from the `rs_poker` crate; the betting rules of
//! one heads-up hand are [`game`] (the crate's arena, which has them, needs a nightly
//! compiler in 4.x and pins tokio to 1.43 in 5.x, which the node cannot take).
//!
//! **Episodes.** Blinds 1/2 chips, stacks of `stack_bb` big blinds. The seed decides the
//! agent's seat (`seat`, or a fair coin from the seed alone, independent of the cards and of
//! the opponent), the deck order and every draw of a randomised opponent, so a seed is one
//! deal and the mean return over seeds is the chips won per hand. Every hand counts: a
//! *walk* (the opponent, as dealer, folds its small blind before the agent acts) is an
//! episode of one turn whose answer changes nothing — its observation says the hand is
//! over, and any reply ends it with the agent's +0.5 big blinds. The agent sees its hole cards, the board, the pot, what it must call, both stacks
//! and what the opponent did since its last turn, and answers one of `fold`, `check`, `call`,
//! `all-in`, and `raise N` (no-limit: raise the round's bet *to* N chips) or `raise` (limit:
//! by the street's fixed size). Anything else, and any illegal amount, is the passive action:
//! check when nothing is owed, fold otherwise. Rewards are 0 until the hand ends, then the
//! agent's net chip change in big blinds.
//!
//! **Opponents** (deterministic from the seed, so episodes replay), the rules of the
//! `rs_poker` arena's agents:
//! - `calling`: `CallingAgent`, always calls (or checks);
//! - `all-in`: `AllInAgent`, always moves all-in (in limit play: raises whenever it may);
//! - `random`: `RandomAgent` (rs_poker 5.0) with its default probabilities — fold (when
//!   owing) with 25 %, 30 %, 50 % and call with 50 %, 60 %, 45 % by the number of raises this
//!   round (blinds not counted), otherwise a raise to a uniform amount in [min raise, max),
//!   not rounded, where max = min(all-in, (players still to act this round + 1) × pot) — its
//!   rule exactly, drawing from a generator seeded by the hand instead of the thread RNG the
//!   crate's agent uses (which could not be replayed). Observations show such amounts to
//!   the cent;
//! - `model`: a frozen policy ([`TextPolicy`], e.g. a snapshot of the model being trained)
//!   playing the other seat from its own observations, sampling with a generator seeded
//!   from (hand seed, its decision number). Built with [`Holdem::with_model_opponent`].
//!
//! **Context budget.** The first prompt (rules and first observation) is at most
//! [`MAX_FIRST_PROMPT_BYTES`] bytes of text, every further decision at most
//! [`MAX_TURN_TOKENS`] sampled tokens plus one observation of at most
//! [`MAX_OBSERVATION_BYTES`] bytes (a byte-level tokenizer never needs more tokens than
//! bytes; the chat template adds a few): [`context_for_decisions`] is the context a model needs
//! for `n` decisions. The embedded model's 256 positions hold one decision (its first
//! prompts of 173–190 tokens leave no room for a second observation); a hand needs up to
//! `max_turns` = 20 in no-limit play.

use std::sync::Arc;

use rand::seq::SliceRandom;
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::env::{EnvMetadata, Environment, Episode, Start, Step};
use crate::{parse_params, Prompt, TaskError};

#[path = "holdem_game.rs"]
pub mod game;

use game::{Game, Move, BB};

const NAME: &str = "holdem";
/// Longest action text that is parsed (anything longer is illegal).
const MAX_ACTION: usize = 24;
/// The agent's token budget per turn (the metadata's suggestion: `raise 20000` and a stop
/// token fit).
pub const MAX_TURN_TOKENS: usize = 12;
/// Longest observation: every field at its widest (chip amounts up to 40 000.00, five board
/// cards, two opponent moves, the no-limit raise range).
pub const MAX_OBSERVATION_BYTES: usize = 224;
/// Longest first observation (preflop: no board, at most one opponent move).
pub const MAX_FIRST_OBSERVATION_BYTES: usize = 200;
/// Longest first prompt: the rules, a newline and the first observation.
pub const MAX_FIRST_PROMPT_BYTES: usize = RULES.len() + 1 + MAX_FIRST_OBSERVATION_BYTES;
/// Tokens a chat template adds around one observation (ChatML's end of turn and headers).
const TEMPLATE_TOKENS: usize = 16;

/// The context (positions) a model with a byte-level tokenizer needs for hands of up to `n`
/// decisions: the first prompt, then per further decision an action and an observation.
pub fn context_for_decisions(n: usize) -> usize {
    MAX_FIRST_PROMPT_BYTES
        + TEMPLATE_TOKENS
        + n * MAX_TURN_TOKENS
        + n.saturating_sub(1) * (MAX_OBSERVATION_BYTES + TEMPLATE_TOKENS)
}

/// A player that answers an observation with an action text: the hook through which a model
/// sits at the table (the opponent `model`). Implementations must be deterministic in their
/// arguments (a model samples with a generator seeded by `seed`).
pub trait TextPolicy: Send + Sync {
    /// The action for `observation`, after the earlier `(observation, own action)` turns of
    /// this hand; `system` is the rules.
    fn act(&self, system: &str, turns: &[(String, String)], observation: &str, seed: u64)
        -> String;
}

/// The rules, as the system message.
pub const RULES: &str = "Heads-up Texas Hold'em, blinds 1/2. Reply with one action.";

/// Parameters of [`Holdem`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HoldemParams {
    /// `calling`, `random`, `all-in` or `model`.
    pub opponent: String,
    /// `no-limit` or `limit`.
    pub betting: String,
    /// Starting stacks in big blinds.
    pub stack_bb: u32,
    /// The agent's seat (0 is the dealer); unset: drawn from the seed.
    pub seat: Option<u8>,
}

impl Default for HoldemParams {
    fn default() -> Self {
        HoldemParams {
            opponent: "calling".into(),
            betting: "no-limit".into(),
            stack_bb: 100,
            seat: None,
        }
    }
}

/// The rule-based opponents (the `model` opponent needs a policy: [`Holdem::with_model_opponent`]).
pub const RULE_BASED: [&str; 3] = ["calling", "random", "all-in"];

/// The Hold'em environment.
#[derive(Clone)]
pub struct Holdem {
    params: HoldemParams,
    limit: bool,
    model: Option<Arc<dyn TextPolicy>>,
}

impl std::fmt::Debug for Holdem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Holdem")
            .field("params", &self.params)
            .finish()
    }
}

impl Holdem {
    /// Builds the environment from JSON parameters (`null` = defaults). The `model` opponent
    /// needs [`Holdem::with_model_opponent`].
    pub fn from_params(params: &serde_json::Value) -> Result<Self, TaskError> {
        Self::new(parse_params(NAME, params)?, None)
    }

    /// The environment with a model in the opponent's seat (`params.opponent` is `model`).
    pub fn with_model_opponent(
        params: HoldemParams,
        policy: Arc<dyn TextPolicy>,
    ) -> Result<Self, TaskError> {
        Self::new(
            HoldemParams {
                opponent: "model".into(),
                ..params
            },
            Some(policy),
        )
    }

    fn new(params: HoldemParams, model: Option<Arc<dyn TextPolicy>>) -> Result<Self, TaskError> {
        let bad = |reason: String| TaskError::InvalidParams {
            task: NAME.into(),
            reason,
        };
        let limit = match params.betting.as_str() {
            "limit" => true,
            "no-limit" => false,
            b => return Err(bad(format!("betting {b:?} is not `limit` or `no-limit`"))),
        };
        if !(2..=10_000).contains(&params.stack_bb) {
            return Err(bad("stack_bb must be in 2..=10000".into()));
        }
        if params.seat.is_some_and(|s| s > 1) {
            return Err(bad("seat must be 0 or 1".into()));
        }
        match params.opponent.as_str() {
            "model" if model.is_none() => {
                return Err(bad(
                    "the `model` opponent is a frozen policy: it is available to `echo-node eval` \
                     and to code that attaches one (Holdem::with_model_opponent)"
                        .into(),
                ))
            }
            o if o != "model" && !RULE_BASED.contains(&o) => {
                return Err(bad(format!(
                    "unknown opponent {o:?} (one of {}, model)",
                    RULE_BASED.join(", ")
                )))
            }
            _ => {}
        }
        Ok(Holdem {
            params,
            limit,
            model,
        })
    }

    /// The agent's seat of hand `seed`.
    pub fn seat(&self, seed: u64) -> usize {
        let s = crate::util::item_rng("holdem/seat", 0, seed).gen_range(0..2usize);
        self.params.seat.map_or(s, usize::from)
    }
}

impl Environment for Holdem {
    fn name(&self) -> &str {
        NAME
    }

    fn metadata(&self) -> EnvMetadata {
        let stack = self.params.stack_bb as f32;
        EnvMetadata {
            name: NAME.into(),
            description: format!(
                "heads-up {} Texas Hold'em against the `{}` opponent; chips won per hand in big blinds",
                self.params.betting, self.params.opponent
            ),
            num_initial_states: None,
            // Limit: at most four bets a street, so at most 2 agent decisions per bet level.
            // No-limit: every raise at least doubles the bet, so a 10 000-bb stack is all in
            // within 14 raises; 4 streets of checks and calls add a few.
            max_turns: if self.limit { 12 } else { 20 },
            return_range: (-stack, stack),
            suggested_tokens_per_turn: MAX_TURN_TOKENS,
            max_observation_tokens: MAX_OBSERVATION_BYTES + TEMPLATE_TOKENS,
            params: serde_json::to_value(&self.params).unwrap_or_default(),
        }
    }

    fn system_prompt(&self) -> Option<String> {
        Some(RULES.into())
    }

    fn reset(&self, seed: u64) -> Result<Start, TaskError> {
        let mut cards = game::deck();
        cards.shuffle(&mut crate::util::item_rng("holdem/deck", 0, seed));
        let stack = self.params.stack_bb as f32 * BB;
        let seat = self.seat(seed);
        let mut hand = Hand {
            game: Game::new(&cards, stack, self.limit),
            seat,
            seed,
            opponent: self.opponent(seed),
            since: Vec::new(),
            opponent_turns: Vec::new(),
        };
        let (text, episode): (String, Box<dyn Episode>) = match hand.advance() {
            Some(text) => (text, Box::new(hand) as Box<dyn Episode>),
            // A walk: the opponent folded before the agent acted. The hand counts.
            None => {
                let g = &hand.game;
                let won = g.net(seat);
                let text = format!(
                    "Hand: {}. Board: -. Pot: {}. Opponent: {}. The hand is over: you win {} chip{}.",
                    cards_text(&g.hole[seat]),
                    chips(g.committed[0] + g.committed[1]),
                    hand.since.join(", "),
                    chips(won),
                    if won == 1.0 { "" } else { "s" },
                );
                (
                    text,
                    Box::new(Walk {
                        reward: Some(won / BB),
                    }),
                )
            }
        };
        Ok(Start {
            prompt: Prompt {
                id: seed.to_string(),
                text,
                answer: String::new(),
            },
            episode,
        })
    }
}

impl Holdem {
    fn opponent(&self, seed: u64) -> Opponent {
        match self.params.opponent.as_str() {
            "calling" => Opponent::Calling,
            "all-in" => Opponent::AllIn,
            "model" => match &self.model {
                Some(p) => Opponent::Model(p.clone()),
                None => Opponent::Calling,
            },
            _ => Opponent::Random(Box::new(crate::util::item_rng("holdem/opponent", 0, seed))),
        }
    }
}

enum Opponent {
    Calling,
    AllIn,
    Random(Box<rand::rngs::StdRng>),
    Model(Arc<dyn TextPolicy>),
}

/// One hand in progress.
struct Hand {
    game: Game,
    seat: usize,
    seed: u64,
    opponent: Opponent,
    /// The opponent's moves since the agent's last turn (for its next observation).
    since: Vec<String>,
    /// A model opponent's own (observation, action) turns.
    opponent_turns: Vec<(String, String)>,
}

impl Hand {
    /// Plays the opponent until the agent must act (its observation) or the hand is over.
    fn advance(&mut self) -> Option<String> {
        while !self.game.over() {
            if self.game.to_act == self.seat {
                let obs = observation(&self.game, self.seat, &self.since);
                self.since.clear();
                return Some(obs);
            }
            let m = self.opponent_move();
            let p = self.game.to_act;
            let before = (
                self.game.round_bet[p],
                self.game.committed[p],
                self.game.owed(p),
            );
            self.game.play(m);
            self.since.push(describe(&self.game, p, before));
        }
        None
    }

    fn opponent_move(&mut self) -> Move {
        let g = &self.game;
        let p = g.to_act;
        let all_in = g.raise_bounds(p).1;
        match &mut self.opponent {
            Opponent::Calling => Move::Call,
            Opponent::AllIn => Move::RaiseTo(all_in),
            Opponent::Random(rng) => random_move(g, rng),
            Opponent::Model(policy) => {
                let obs = observation(g, p, &[]);
                let k = self.opponent_turns.len() as u64;
                let mut h = blake3::Hasher::new();
                h.update(b"holdem/model-opponent");
                h.update(&self.seed.to_le_bytes());
                h.update(&k.to_le_bytes());
                let seed =
                    u64::from_le_bytes(h.finalize().as_bytes()[..8].try_into().unwrap_or_default());
                let text = policy.act(RULES, &self.opponent_turns, &obs, seed);
                let m = parse(&text, g, p);
                self.opponent_turns.push((obs, text));
                m
            }
        }
    }
}

/// A hand the opponent ended before the agent acted: one turn whose answer changes nothing.
struct Walk {
    /// The agent's chips in big blinds, until paid.
    reward: Option<f32>,
}

impl Episode for Walk {
    fn step(&mut self, _action: &str) -> Step {
        Step::Done {
            reward: self.reward.take().unwrap_or(0.0),
        }
    }

    fn truncate(&mut self) -> f32 {
        self.reward.take().unwrap_or(0.0)
    }

    fn reference_action(&self, _rng: &mut dyn rand::RngCore) -> Option<String> {
        None
    }
}

/// rs_poker 5.0's `RandomAgent::act` with its default probabilities (see the module docs):
/// the raise index is the round's raises (the blinds are forced bets, not raises), the cap
/// `(players who still need to act this round + 1) × pot`, the amount drawn unrounded.
fn random_move(g: &Game, rng: &mut rand::rngs::StdRng) -> Move {
    const FOLD: [f64; 3] = [0.25, 0.30, 0.50];
    const CALL: [f64; 3] = [0.5, 0.6, 0.45];
    let p = g.to_act;
    let i = usize::from(g.bets.saturating_sub(u8::from(g.street == 0))).min(2);
    let (min, all_in) = g.raise_bounds(p);
    let pot = g.committed[0] + g.committed[1];
    // rs_poker's `needs_action`: players with chips who have not acted since the last raise
    // (the player to act among them).
    let to_act = (0..2).filter(|&q| g.stacks[q] > 0.0 && !g.acted[q]).count();
    let max = all_in.min((to_act as f32 + 1.0) * pot).max(min);
    if g.owed(p) > 0.0 && rng.gen_bool(FOLD[i]) {
        Move::Fold
    } else if rng.gen_bool(CALL[i]) || !g.can_raise(p) {
        Move::Call
    } else if max > min {
        Move::RaiseTo(rng.gen_range(min..max))
    } else {
        Move::RaiseTo(max)
    }
}

/// A chip amount as observations show it: whole chips as integers, others to the cent
/// (the `random` opponent's raises are not whole).
fn chips(x: f32) -> String {
    if x.fract() == 0.0 {
        format!("{x}")
    } else {
        format!("{x:.2}")
    }
}

fn cards_text(c: &[rs_poker::core::Card]) -> String {
    if c.is_empty() {
        "-".into()
    } else {
        c.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl Episode for Hand {
    fn step(&mut self, action: &str) -> Step {
        if self.game.over() || self.game.to_act != self.seat {
            return Step::Done { reward: 0.0 };
        }
        let m = parse(action, &self.game, self.seat);
        self.game.play(m);
        match self.advance() {
            Some(observation) => Step::Continue {
                observation,
                reward: 0.0,
            },
            None => Step::Done {
                reward: self.game.net(self.seat) / BB,
            },
        }
    }

    fn truncate(&mut self) -> f32 {
        // The agent checks or folds from here on.
        while self.advance().is_some() {
            let m = if self.game.owed(self.seat) > 0.0 {
                Move::Fold
            } else {
                Move::Call
            };
            self.game.play(m);
        }
        self.game.net(self.seat) / BB
    }

    fn reference_action(&self, rng: &mut dyn rand::RngCore) -> Option<String> {
        let g = &self.game;
        if g.over() || g.to_act != self.seat {
            return None;
        }
        let mut options = vec![
            if g.owed(self.seat) > 0.0 {
                "fold"
            } else {
                "check"
            }
            .to_string(),
            "call".to_string(),
        ];
        if g.can_raise(self.seat) {
            // The agent raises in whole chips (see `parse`): the smallest whole amount at or
            // above the minimum, or all-in when that is past the stack.
            let (min, all_in) = g.raise_bounds(self.seat);
            options.push(if g.limit {
                "raise".to_string()
            } else if min.ceil() <= all_in {
                format!("raise {}", min.ceil() as u32)
            } else {
                "all-in".to_string()
            });
        }
        Some(options[rng.gen_range(0..options.len())].clone())
    }
}

/// The action text of player `p` as a move (see the module docs for the grammar).
fn parse(text: &str, g: &Game, p: usize) -> Move {
    let owed = g.owed(p) > 0.0;
    let passive = if owed { Move::Fold } else { Move::Call };
    if text.len() > MAX_ACTION {
        return passive;
    }
    let (min, all_in) = g.raise_bounds(p);
    match text.split_once(' ') {
        None => match text {
            "check" if !owed => Move::Call,
            "call" => Move::Call,
            "all-in" if g.can_raise(p) => Move::RaiseTo(all_in),
            "all-in" => Move::Call,
            "raise" | "bet" if g.limit && g.can_raise(p) => Move::RaiseTo(min),
            _ => passive,
        },
        Some(("raise" | "bet", n)) if !g.limit && g.can_raise(p) => match n.parse::<u32>() {
            // Canonical decimals only ("010" and "+10" are not amounts).
            Ok(v) if v.to_string() == n && (v as f32) >= min && (v as f32) <= all_in => {
                Move::RaiseTo(v as f32)
            }
            _ => passive,
        },
        _ => passive,
    }
}

/// What player `p` did, for the other's observation, from its (round bet, chips in the
/// hand, chips owed) before the move.
fn describe(g: &Game, p: usize, (round_bet, committed, owed_before): (f32, f32, f32)) -> String {
    let put = g.committed[p] - committed;
    if g.folded == Some(p) {
        "fold".into()
    } else if put > owed_before {
        format!("raise to {}", chips(round_bet + put))
    } else if owed_before > 0.0 {
        "call".into()
    } else {
        "check".into()
    }
}

/// Player `p`'s observation at its decision.
fn observation(g: &Game, p: usize, since: &[String]) -> String {
    let owed = g.owed(p);
    let mut obs = format!(
        "Hand: {}. Board: {}. Pot: {}. To call: {}. Stack: {}. Opponent stack: {}.",
        cards_text(&g.hole[p]),
        cards_text(g.shown()),
        chips(g.committed[0] + g.committed[1]),
        chips(owed),
        chips(g.stacks[p]),
        chips(g.stacks[1 - p]),
    );
    if !since.is_empty() {
        obs.push_str(&format!(" Opponent: {}.", since.join(", ")));
    }
    obs.push_str(if owed > 0.0 {
        " fold, call"
    } else {
        " check, call"
    });
    if g.can_raise(p) {
        if g.limit {
            obs.push_str(", raise");
        } else {
            let (min, max) = g.raise_bounds(p);
            obs.push_str(&format!(
                ", raise N ({}-{}), all-in",
                chips(min),
                chips(max)
            ));
        }
    }
    obs.push('?');
    obs
}

#[cfg(test)]
#[path = "holdem_tests.rs"]
mod tests;
