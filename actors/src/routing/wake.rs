//! Wake discipline (I7): when a session's parent is woken.

/// A session's turn state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Turn {
    /// Between turns: may be woken.
    Idle,
    /// In a turn: never woken.
    Busy,
}

/// Wake discipline (I7): woken when idle with ready items, at most once between two boundaries
/// or busy → idle changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WakeState {
    turn: Turn,
    woken: bool,
}

impl Default for WakeState {
    fn default() -> Self {
        WakeState {
            turn: Turn::Idle,
            woken: false,
        }
    }
}

impl WakeState {
    /// The current turn state.
    pub fn turn(&self) -> Turn {
        self.turn
    }

    /// A turn change; busy → idle opens a new idle period.
    pub fn set_turn(&mut self, turn: Turn) {
        if self.turn == Turn::Busy && turn == Turn::Idle {
            self.woken = false;
        }
        self.turn = turn;
    }

    /// A boundary happened: the next ready item may wake the session again.
    pub fn boundary(&mut self) {
        self.woken = false;
    }

    /// Whether to wake now; if so, the wake is counted.
    pub fn decide(&mut self, wake_capable: bool, ready: usize) -> bool {
        if wake_capable && self.turn == Turn::Idle && ready > 0 && !self.woken {
            self.woken = true;
            return true;
        }
        false
    }
}
