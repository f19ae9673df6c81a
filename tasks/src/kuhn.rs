//! `kuhn-poker`: Kuhn poker against a fixed opponent, with an exact evaluator.
//!
//! The game: three cards J < Q < K, one dealt to each of two players; both ante 1; player 1
//! checks or bets 1; after a check player 2 checks (showdown for 1) or bets; facing a bet a
//! player folds (loses the ante) or calls (showdown for 2). Its value for player 1 is −1/18
//! (Kuhn, 1950): the classic check of an implementation.
//!
//! **Episodes.** The agent plays one hand against the configured opponent. The seed decides
//! the deal, the agent's seat and the opponent's coin flips (a generator derived from the
//! seed and the decision, never call order), so one seed is one initial state and a group of
//! episodes from it compares the agent's own choices (ECHO-2 Eq. 21). The agent answers with
//! one word: `check` or `bet` when nothing is owed, `fold` or `call` facing a bet. Anything
//! else is an illegal action and counts as the passive one (check, or fold). Rewards are 0
//! until the hand ends, then the agent's net chip change (±1 or ±2), so the return (Eq. 20)
//! is the chips won — less [`KuhnParams::illegal_penalty`] per illegal action when that
//! reward shaping is on.
//!
//! **Exact evaluation.** The agent has 12 information sets (its seat × its card × the
//! betting so far). Given the probability of the aggressive action (bet or call) at each,
//! [`Strategy`] arithmetic gives the exact expected value against the opponent, the value of
//! the best response to the opponent, and the policy's exploitability — no sampling
//! ([`ExactGame`]). Exact for a policy that says legal words; an illegal first word plays as
//! `check`, but the model's conversation at player 1's next decision then holds that word,
//! not `check`, and the evaluator reads the probabilities after `check`. With much illegal
//! mass the figure is therefore not exact (nor a bound): `rollout::eval` reports the illegal
//! mass and, above a threshold, the sampled EV of the unshaped game beside it.

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::env::{
    Decision, EnvMetadata, Environment, Episode, ExactGame, ExactReport, Start, Step,
};
use crate::{parse_params, Prompt, TaskError};

const NAME: &str = "kuhn-poker";
/// Card names, J < Q < K.
const CARDS: [&str; 3] = ["J", "Q", "K"];
/// The six deals (player 1's card, player 2's card).
const DEALS: [(usize, usize); 6] = [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)];

/// The rules, as the system message.
pub const RULES: &str = "Kuhn poker. Cards J<Q<K. Ante 1, bet 1. Reply with one word.";

/// Index of an information set: `seat · 6 + card · 2 + h`, where for player 1 (seat 0)
/// `h = 0` is the opening decision and `h = 1` is facing a bet after checking, and for
/// player 2 (seat 1) `h = 0` is after a check and `h = 1` is facing a bet.
pub fn info_set(seat: usize, card: usize, h: usize) -> usize {
    seat * 6 + card * 2 + h
}

/// A behaviour strategy for both seats: the probability of the aggressive action (bet, or
/// call) at each of the 12 information sets ([`info_set`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Strategy(pub [f64; 12]);

impl Strategy {
    /// The same probability everywhere.
    pub fn constant(p: f64) -> Self {
        Strategy([p; 12])
    }

    /// The equilibrium family: player 1 bets J with `alpha` ∈ [0, 1/3], never bets Q and
    /// calls with it at `alpha + 1/3`, bets K at `3·alpha` and always calls; player 2 (whose
    /// strategy is unique) bets K and calls with it, bets J after a check at 1/3, calls with
    /// Q at 1/3, and otherwise passes.
    pub fn equilibrium(alpha: f64) -> Self {
        let mut s = [0.0; 12];
        s[info_set(0, 0, 0)] = alpha;
        s[info_set(0, 1, 1)] = alpha + 1.0 / 3.0;
        s[info_set(0, 2, 0)] = 3.0 * alpha;
        s[info_set(0, 2, 1)] = 1.0;
        s[info_set(1, 0, 0)] = 1.0 / 3.0;
        s[info_set(1, 1, 1)] = 1.0 / 3.0;
        s[info_set(1, 2, 0)] = 1.0;
        s[info_set(1, 2, 1)] = 1.0;
        Strategy(s)
    }

    /// Bets and calls with K only.
    pub fn tight() -> Self {
        let mut s = [0.0; 12];
        for seat in 0..2 {
            s[info_set(seat, 2, 0)] = 1.0;
            s[info_set(seat, 2, 1)] = 1.0;
        }
        Strategy(s)
    }

    fn p(&self, seat: usize, card: usize, h: usize) -> f64 {
        self.0[info_set(seat, card, h)].clamp(0.0, 1.0)
    }
}

/// +1 when `a` beats `b` at showdown, −1 otherwise.
fn win(a: usize, b: usize) -> f64 {
    if a > b {
        1.0
    } else {
        -1.0
    }
}

/// Player 1's expected payoff per hand when player 1 plays `p1`'s seat-0 part and player 2
/// plays `p2`'s seat-1 part (the six deals equally likely).
pub fn ev_p1(p1: &Strategy, p2: &Strategy) -> f64 {
    let mut total = 0.0;
    for (c1, c2) in DEALS {
        let w = win(c1, c2);
        let (bet, call) = (p1.p(0, c1, 0), p1.p(0, c1, 1));
        let (q_bet, q_call) = (p2.p(1, c2, 0), p2.p(1, c2, 1));
        let check = (1.0 - q_bet) * w + q_bet * (-(1.0 - call) + call * 2.0 * w);
        let bet_v = (1.0 - q_call) + q_call * 2.0 * w;
        total += (1.0 - bet) * check + bet * bet_v;
    }
    total / 6.0
}

/// The best player-1 payoff per hand against player 2 playing `p2`'s seat-1 part: at each
/// information set the better action given the opponent's reach probabilities.
pub fn best_response_p1(p2: &Strategy) -> f64 {
    let mut total = 0.0;
    for c1 in 0..3 {
        let others = (0..3).filter(|&c| c != c1);
        let (mut fold, mut call, mut check_rest, mut bet) = (0.0, 0.0, 0.0, 0.0);
        for c2 in others {
            let w = win(c1, c2);
            let (q_bet, q_call) = (p2.p(1, c2, 0), p2.p(1, c2, 1));
            fold -= q_bet;
            call += q_bet * 2.0 * w;
            check_rest += (1.0 - q_bet) * w;
            bet += (1.0 - q_call) + q_call * 2.0 * w;
        }
        total += f64::max(check_rest + fold.max(call), bet);
    }
    total / 6.0
}

/// The best player-2 payoff per hand against player 1 playing `p1`'s seat-0 part.
pub fn best_response_p2(p1: &Strategy) -> f64 {
    let mut total = 0.0;
    for c2 in 0..3 {
        let (mut check, mut bet, mut fold, mut call) = (0.0, 0.0, 0.0, 0.0);
        for c1 in (0..3).filter(|&c| c != c2) {
            let w2 = -win(c1, c2);
            let (p_bet, p_call) = (p1.p(0, c1, 0), p1.p(0, c1, 1));
            let reach_check = 1.0 - p_bet;
            check += reach_check * w2;
            bet += reach_check * ((1.0 - p_call) + p_call * 2.0 * w2);
            fold -= p_bet;
            call += p_bet * 2.0 * w2;
        }
        total += check.max(bet) + fold.max(call);
    }
    total / 6.0
}

/// The exact figures of `policy` (playing both seats, each half of the time) against
/// `opponent` (playing the other seat).
pub fn evaluate(policy: &Strategy, opponent: &Strategy) -> ExactReport {
    ExactReport {
        ev: 0.5 * (ev_p1(policy, opponent) - ev_p1(opponent, policy)),
        best_response: 0.5 * (best_response_p1(opponent) + best_response_p2(opponent)),
        exploitability: 0.5 * (best_response_p1(policy) + best_response_p2(policy)),
    }
}

/// Parameters of [`Kuhn`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KuhnParams {
    /// The opponent: `equilibrium`, `always-bet`, `always-pass`, `random` or `tight`.
    pub opponent: String,
    /// The equilibrium opponent's bluffing rate with J as player 1, in [0, 1/3].
    pub alpha: f64,
    /// The agent's seat (0: acts first, 1: second); unset: drawn from the seed.
    pub seat: Option<u8>,
    /// Reward shaping, in [0, 2]: an illegal action still plays as the passive one, and its
    /// turn's reward is `−illegal_penalty` on top of the chips. 0 (the default) keeps the
    /// return the chips won. Training needs it (`echo-node demo` sets 1): a word that is no
    /// action folds like `fold` and is reached by many token paths, so without it RL learns
    /// to fold by saying anything, and that spreads to the hands that should call. The exact
    /// evaluator counts chips only.
    pub illegal_penalty: f64,
}

impl Default for KuhnParams {
    fn default() -> Self {
        KuhnParams {
            opponent: "equilibrium".into(),
            alpha: 0.0,
            seat: None,
            illegal_penalty: 0.0,
        }
    }
}

/// The opponents by name: (name, what it does).
pub const OPPONENTS: [(&str, &str); 5] = [
    (
        "equilibrium",
        "the equilibrium family (alpha sets its bluff rate)",
    ),
    ("always-bet", "always bets and calls"),
    ("always-pass", "always checks and folds"),
    ("random", "bets or calls half of the time"),
    ("tight", "bets and calls with K only"),
];

/// The Kuhn poker environment.
#[derive(Debug, Clone)]
pub struct Kuhn {
    params: KuhnParams,
    opponent: Strategy,
}

impl Kuhn {
    /// Builds the environment from JSON parameters (`null` = defaults).
    pub fn from_params(params: &serde_json::Value) -> Result<Self, TaskError> {
        Self::new(parse_params(NAME, params)?)
    }

    /// Builds the environment.
    pub fn new(params: KuhnParams) -> Result<Self, TaskError> {
        let bad = |reason: String| TaskError::InvalidParams {
            task: NAME.into(),
            reason,
        };
        if !(0.0..=1.0 / 3.0 + 1e-12).contains(&params.alpha) {
            return Err(bad(format!("alpha {} is outside [0, 1/3]", params.alpha)));
        }
        if !(0.0..=2.0).contains(&params.illegal_penalty) {
            return Err(bad(format!(
                "illegal_penalty {} is outside [0, 2]",
                params.illegal_penalty
            )));
        }
        if params.seat.is_some_and(|s| s > 1) {
            return Err(bad("seat must be 0 or 1".into()));
        }
        let opponent = match params.opponent.as_str() {
            "equilibrium" => Strategy::equilibrium(params.alpha),
            "always-bet" => Strategy::constant(1.0),
            "always-pass" => Strategy::constant(0.0),
            "random" => Strategy::constant(0.5),
            "tight" => Strategy::tight(),
            other => {
                let names: Vec<&str> = OPPONENTS.iter().map(|o| o.0).collect();
                return Err(bad(format!(
                    "unknown opponent {other:?} (one of {})",
                    names.join(", ")
                )));
            }
        };
        Ok(Kuhn { params, opponent })
    }

    /// The opponent's strategy.
    pub fn opponent_strategy(&self) -> &Strategy {
        &self.opponent
    }

    /// The deal and the agent's seat of initial state `seed`: (agent seat, P1 card, P2 card).
    pub fn deal(&self, seed: u64) -> (usize, usize, usize) {
        let mut rng = crate::util::item_rng("kuhn-poker/deal", 0, seed);
        let seat = rng.gen_range(0..2usize);
        let (c1, c2) = DEALS[rng.gen_range(0..6usize)];
        (self.params.seat.map_or(seat, usize::from), c1, c2)
    }
}

/// The observation at the agent's information set (`seat`, `card`, `h`).
pub fn observation(seat: usize, card: usize, h: usize) -> String {
    let c = CARDS[card];
    match (seat, h) {
        (0, 0) => format!("You act first. Card: {c}. check or bet?"),
        (0, _) => format!("Card: {c}. Opponent bets. fold or call?"),
        (_, 0) => format!("You act second. Card: {c}. Opponent checks. check or bet?"),
        (_, _) => format!("You act second. Card: {c}. Opponent bets. fold or call?"),
    }
}

/// The two legal words at history `h` of `seat`: (passive, aggressive).
fn words(seat: usize, h: usize) -> (&'static str, &'static str) {
    if seat <= 1 && h == 0 {
        ("check", "bet")
    } else {
        ("fold", "call")
    }
}

/// The running hand. `history` is the betting so far in Kuhn's notation (`c` check, `b`
/// bet, `f` fold, `k` call).
struct Hand {
    seed: u64,
    seat: usize,
    cards: [usize; 2],
    history: String,
    opponent: Strategy,
    /// The agent's information-set history index at its pending decision.
    pending: Option<usize>,
    /// The shaping reward's size for an illegal action ([`KuhnParams::illegal_penalty`]).
    penalty: f32,
}

impl Hand {
    /// The opponent's coin at decision `node` (`0` P1 open, `1` P2 after check, `2` P2 after
    /// bet, `3` P1 after check-bet): uniform in [0, 1) from (seed, node).
    fn coin(&self, node: u64) -> f64 {
        crate::util::item_rng("kuhn-poker/opponent", self.seed, node).gen::<f64>()
    }

    fn opponent_acts(&mut self, node: u64, h: usize) -> bool {
        let seat = 1 - self.seat;
        let p = self.opponent.p(seat, self.cards[seat], h);
        self.coin(node) < p
    }

    /// The agent's payoff at a terminal history.
    fn payoff(&self) -> f32 {
        let w = win(self.cards[0], self.cards[1]) as f32;
        let p1 = match self.history.as_str() {
            "cc" => w,
            "cbf" => -1.0,
            "cbk" | "bk" => 2.0 * w,
            "bf" => 1.0,
            _ => 0.0,
        };
        if self.seat == 0 {
            p1
        } else {
            -p1
        }
    }

    /// Plays the opponent until the agent must act or the hand ends.
    fn advance(&mut self) -> Option<String> {
        loop {
            let (to_act, h, node) = match self.history.as_str() {
                "" => (0, 0, 0),
                "c" => (1, 0, 1),
                "b" => (1, 1, 2),
                "cb" => (0, 1, 3),
                _ => return None,
            };
            if to_act == self.seat {
                self.pending = Some(h);
                return Some(observation(self.seat, self.cards[self.seat], h));
            }
            let aggressive = self.opponent_acts(node, h);
            self.push(aggressive);
        }
    }

    fn push(&mut self, aggressive: bool) {
        let facing_bet = self.history.ends_with('b');
        self.history.push(match (facing_bet, aggressive) {
            (false, false) => 'c',
            (false, true) => 'b',
            (true, false) => 'f',
            (true, true) => 'k',
        });
    }
}

impl Episode for Hand {
    fn step(&mut self, action: &str) -> Step {
        let Some(h) = self.pending.take() else {
            return Step::Done { reward: 0.0 };
        };
        // Exact words only (a bounded comparison): anything else is the passive action, and
        // pays the shaping penalty.
        let (pass, aggr) = words(self.seat, h);
        let aggressive = action == aggr;
        let shaping = if aggressive || action == pass {
            0.0
        } else {
            -self.penalty
        };
        self.push(aggressive);
        match self.advance() {
            Some(observation) => Step::Continue {
                observation,
                reward: shaping,
            },
            None => Step::Done {
                reward: self.payoff() + shaping,
            },
        }
    }

    fn truncate(&mut self) -> f32 {
        // The agent gives up the hand: it loses its ante (it has never more in the pot at
        // one of its decisions) and, having said no action, pays the shaping penalty.
        self.pending = None;
        -1.0 - self.penalty
    }

    fn reference_action(&self, rng: &mut dyn rand::RngCore) -> Option<String> {
        let h = self.pending?;
        let (pass, aggr) = words(self.seat, h);
        Some(if rng.gen_bool(0.5) { aggr } else { pass }.to_string())
    }
}

impl Environment for Kuhn {
    fn name(&self) -> &str {
        NAME
    }

    fn metadata(&self) -> EnvMetadata {
        EnvMetadata {
            name: NAME.into(),
            description: format!(
                "Kuhn poker against the `{}` opponent; exact EV, best response and exploitability",
                self.params.opponent
            ),
            num_initial_states: None,
            max_turns: 2,
            // At worst a called bet (−2), or two illegal actions each paying the penalty, the
            // second a fold (−1).
            return_range: (
                (-1.0 - 2.0 * self.params.illegal_penalty as f32).min(-2.0),
                2.0,
            ),
            suggested_tokens_per_turn: 8,
            max_observation_tokens: 64,
            params: serde_json::to_value(&self.params).unwrap_or_default(),
        }
    }

    fn system_prompt(&self) -> Option<String> {
        Some(RULES.into())
    }

    fn reset(&self, seed: u64) -> Result<Start, TaskError> {
        let (seat, c1, c2) = self.deal(seed);
        let mut hand = Hand {
            seed,
            seat,
            cards: [c1, c2],
            history: String::new(),
            opponent: self.opponent,
            pending: None,
            penalty: self.params.illegal_penalty as f32,
        };
        // The agent acts at least once in every hand (player 2 always gets a decision).
        let text = hand.advance().ok_or_else(|| TaskError::Generation {
            task: NAME.into(),
            reason: "a hand ended before the agent acted".into(),
        })?;
        Ok(Start {
            prompt: Prompt {
                id: seed.to_string(),
                text,
                answer: String::new(),
            },
            episode: Box::new(hand),
        })
    }

    fn exact(&self) -> Option<&dyn ExactGame> {
        Some(self)
    }
}

impl ExactGame for Kuhn {
    fn decisions(&self) -> Vec<Decision> {
        let mut out = Vec::with_capacity(12);
        for seat in 0..2 {
            for card in 0..3 {
                for h in 0..2 {
                    let history = if seat == 0 && h == 1 {
                        vec![(observation(0, card, 0), "check".to_string())]
                    } else {
                        Vec::new()
                    };
                    let (pass, aggr) = words(seat, h);
                    out.push(Decision {
                        history,
                        observation: observation(seat, card, h),
                        choices: vec![pass.into(), aggr.into()],
                    });
                }
            }
        }
        out
    }

    fn evaluate(&self, probs: &[Vec<f64>]) -> Result<ExactReport, TaskError> {
        if probs.len() != 12 || probs.iter().any(|p| p.len() != 2) {
            return Err(TaskError::InvalidParams {
                task: NAME.into(),
                reason: "exact evaluation needs 12 decisions × 2 choices".into(),
            });
        }
        let mut s = [0.0; 12];
        for (i, p) in probs.iter().enumerate() {
            let (pass, aggr) = (p[0].clamp(0.0, 1.0), p[1].clamp(0.0, 1.0));
            // The passive action also takes every illegal output.
            s[i] = if pass + aggr > 1.0 {
                aggr / (pass + aggr)
            } else {
                aggr
            };
        }
        Ok(evaluate(&Strategy(s), &self.opponent))
    }

    fn opponent(&self) -> String {
        self.params.opponent.clone()
    }

    fn unshaped(&self) -> std::sync::Arc<dyn Environment> {
        let mut k = self.clone();
        k.params.illegal_penalty = 0.0;
        std::sync::Arc::new(k)
    }
}

#[cfg(test)]
#[path = "kuhn_tests.rs"]
mod tests;
