//! The rules of one heads-up Hold'em hand: blinds, four betting rounds (limit or no-limit),
//! all-ins, and the showdown with `rs_poker`'s seven-card ranking. Pure state transitions,
//! no randomness: the deck order is given.
//!
//! Heads-up conventions: the dealer posts the small blind and acts first before the flop;
//! the other player (big blind) acts first after it. A raise must raise by at least the
//! previous raise (and the big blind); a short all-in is always allowed. In limit play every
//! bet or raise is one fixed size (a small bet of 1 big blind before the turn, a big bet of 2
//! after) and a round has at most four bets.

use rs_poker::core::{Card, Rankable, Suit, Value};

/// Small and big blind, in chips.
pub const SB: f32 = 1.0;
pub const BB: f32 = 2.0;
/// Bets per round in limit play (a bet and three raises).
pub const LIMIT_BETS: u8 = 4;

/// What a player does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Move {
    Fold,
    /// Match the bet (a check when nothing is owed; all-in for less when short).
    Call,
    /// Raise the round's bet to this total (clamped to the player's all-in).
    RaiseTo(f32),
}

/// The 52 cards in a fixed order (suit-major), for a seeded shuffle.
pub fn deck() -> Vec<Card> {
    Suit::suits()
        .into_iter()
        .flat_map(|s| Value::values().into_iter().map(move |v| Card::new(v, s)))
        .collect()
}

/// One hand in progress.
#[derive(Debug, Clone)]
pub struct Game {
    pub limit: bool,
    /// Player 0 is the dealer (small blind).
    pub hole: [[Card; 2]; 2],
    /// The five board cards, revealed by street.
    pub board: [Card; 5],
    /// Chips behind.
    pub stacks: [f32; 2],
    /// Chips put in during the whole hand.
    pub committed: [f32; 2],
    /// Chips put in during this betting round.
    pub round_bet: [f32; 2],
    /// The round's bet to match, and the smallest raise increment.
    pub bet: f32,
    pub min_raise: f32,
    /// Bets and raises this round (the blinds count as the first bet).
    pub bets: u8,
    /// 0 preflop, 1 flop, 2 turn, 3 river, 4 showdown.
    pub street: usize,
    pub to_act: usize,
    /// Whether each player has acted since the last raise.
    pub acted: [bool; 2],
    pub folded: Option<usize>,
}

impl Game {
    /// Deals from `cards` (at least 9: two hole cards each, then the board) with `stack`
    /// chips each and posts the blinds.
    pub fn new(cards: &[Card], stack: f32, limit: bool) -> Self {
        let mut g = Game {
            limit,
            hole: [[cards[0], cards[2]], [cards[1], cards[3]]],
            board: [cards[4], cards[5], cards[6], cards[7], cards[8]],
            stacks: [stack; 2],
            committed: [0.0; 2],
            round_bet: [0.0; 2],
            bet: BB,
            min_raise: BB,
            bets: 1,
            street: 0,
            to_act: 0,
            acted: [false; 2],
            folded: None,
        };
        g.put(0, SB);
        g.put(1, BB);
        g
    }

    fn put(&mut self, p: usize, chips: f32) {
        let mut c = chips.min(self.stacks[p]).max(0.0);
        // Unrounded amounts (the `random` opponent's) leave float dust: a stack within
        // 0.001 chip of empty goes in whole, as rs_poker's approximate zero test counts it
        // all in.
        if self.stacks[p] - c < 1e-3 {
            c = self.stacks[p];
        }
        self.stacks[p] -= c;
        self.committed[p] += c;
        self.round_bet[p] += c;
    }

    /// The board cards shown so far.
    pub fn shown(&self) -> &[Card] {
        match self.street {
            0 => &[],
            1 => &self.board[..3],
            2 => &self.board[..4],
            _ => &self.board,
        }
    }

    /// True once the hand is decided (a fold or the showdown).
    pub fn over(&self) -> bool {
        self.folded.is_some() || self.street >= 4
    }

    /// What player `p` owes to call.
    pub fn owed(&self, p: usize) -> f32 {
        (self.bet - self.round_bet[p]).max(0.0)
    }

    /// The fixed raise size of the current street in limit play.
    pub fn limit_size(&self) -> f32 {
        if self.street >= 2 {
            2.0 * BB
        } else {
            BB
        }
    }

    /// The smallest total a raise must reach, and the most `p` can put in this round.
    pub fn raise_bounds(&self, p: usize) -> (f32, f32) {
        let max = self.round_bet[p] + self.stacks[p];
        let min = if self.limit {
            self.bet + self.limit_size()
        } else {
            self.bet + self.min_raise.max(BB)
        };
        (min.min(max), max)
    }

    /// True when `p` may raise: chips behind, an opponent who can still call, and (in
    /// limit play) the round not capped.
    pub fn can_raise(&self, p: usize) -> bool {
        self.stacks[p] > self.owed(p)
            && self.stacks[1 - p] > 0.0
            && !(self.limit && self.bets >= LIMIT_BETS)
    }

    /// Applies `m` for the player to act (an impossible raise is a call), then moves the
    /// hand on: to the other player, the next street, or the end.
    pub fn play(&mut self, m: Move) {
        if self.over() {
            return;
        }
        let p = self.to_act;
        match m {
            Move::Fold if self.owed(p) > 0.0 => {
                self.folded = Some(p);
                return;
            }
            Move::RaiseTo(x) if self.can_raise(p) => {
                let (min, max) = self.raise_bounds(p);
                let to = if self.limit { min } else { x.clamp(min, max) };
                let raise = to - self.bet;
                if raise >= self.min_raise {
                    self.min_raise = raise;
                }
                self.bet = self.bet.max(to);
                self.bets += 1;
                self.put(p, to - self.round_bet[p]);
                self.acted = [false; 2];
            }
            // A check, a call, an impossible fold or raise.
            _ => self.put(p, self.owed(p)),
        }
        self.acted[p] = true;
        self.advance();
    }

    /// Moves to the next player to act, or closes the round (and deals on) when both have
    /// acted with equal bets or nobody can act any more.
    fn advance(&mut self) {
        loop {
            let other = 1 - self.to_act;
            let settled = self.round_bet[0] == self.round_bet[1]
                || self.stacks[0] == 0.0
                || self.stacks[1] == 0.0;
            let can_act = |p: usize| self.stacks[p] > 0.0;
            let needs = |p: usize| can_act(p) && (!self.acted[p] || self.owed(p) > 0.0);
            if needs(other) {
                self.to_act = other;
                return;
            }
            if !settled && needs(self.to_act) {
                return;
            }
            // The round is closed.
            self.street += 1;
            self.round_bet = [0.0; 2];
            self.bet = 0.0;
            self.min_raise = BB;
            self.bets = 0;
            self.acted = [false; 2];
            self.to_act = 1;
            if self.street >= 4 {
                return;
            }
            // With someone all-in nobody bets again: run the board out.
            if !(can_act(0) && can_act(1)) {
                self.acted = [true; 2];
                continue;
            }
            return;
        }
    }

    /// Player `p`'s net chips once the hand is over (0 while it runs): a fold loses what the
    /// folder put in; at the showdown the better seven-card hand wins what both matched, and
    /// a tie splits.
    pub fn net(&self, p: usize) -> f32 {
        if let Some(f) = self.folded {
            let won = self.committed[f];
            return if f == p { -won } else { won };
        }
        if self.street < 4 {
            return 0.0;
        }
        let matched = self.committed[0].min(self.committed[1]);
        let rank = |q: usize| {
            let mut cards = self.board.to_vec();
            cards.extend_from_slice(&self.hole[q]);
            cards.rank()
        };
        match rank(p).cmp(&rank(1 - p)) {
            std::cmp::Ordering::Greater => matched,
            std::cmp::Ordering::Less => -matched,
            std::cmp::Ordering::Equal => 0.0,
        }
    }
}
