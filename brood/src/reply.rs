//! What a delegate call answers, in the embedding API.

use crate::{ReadyItem, UnitRow};

/// What a delegate call answers.
#[derive(Debug, Clone)]
pub enum DelegateReply {
    /// Accepted in the background: results come at turn boundaries.
    Background {
        /// `deleg_<hex>`.
        call_id: String,
        /// The call's set ordinal in its session.
        set: u64,
        /// Its completion units.
        units: Vec<UnitRow>,
        /// What the model should do now (finish independent work, end the turn).
        note: String,
    },
    /// Ran synchronously: the results are here and count as delivered.
    Sync {
        /// `deleg_<hex>`.
        call_id: String,
        /// The call's set ordinal in its session.
        set: u64,
        /// Its completion units.
        units: Vec<UnitRow>,
        /// Why a background call was forced to sync, if it was.
        forced_sync_reason: Option<String>,
        /// Every child's result.
        results: Vec<ReadyItem>,
        /// The note, then the rendered results.
        note: String,
        /// The results rendered as an envelope's text.
        text: String,
    },
}

impl DelegateReply {
    /// The call id.
    pub fn call_id(&self) -> &str {
        match self {
            DelegateReply::Background { call_id, .. } | DelegateReply::Sync { call_id, .. } => call_id,
        }
    }

    /// The set ordinal.
    pub fn set(&self) -> u64 {
        match self {
            DelegateReply::Background { set, .. } | DelegateReply::Sync { set, .. } => *set,
        }
    }

    /// The note for the model.
    pub fn note(&self) -> &str {
        match self {
            DelegateReply::Background { note, .. } | DelegateReply::Sync { note, .. } => note,
        }
    }
}
