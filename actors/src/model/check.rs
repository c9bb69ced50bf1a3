//! Checks of rows read back from the ledger: values brood never writes mean the ledger was
//! damaged, and such a row is quarantined rather than trusted (a count at its maximum would
//! overflow at the next increment; an id that does not match its parts would route wrongly).

use super::*;

/// A row whose stored values cannot be right: brood never writes them, so reading one means
/// the ledger was damaged. Checked on every row read back; the offender is quarantined.
pub trait CheckRow {
    /// What is wrong with the row, if anything.
    fn check(&self) -> Result<(), String>;
}

/// Set numbers beyond this are damage: a session would need billions of calls a second for a
/// century to reach it, and staying far below `u64::MAX` keeps every `+ 1` exact.
pub(crate) const MAX_SET: u64 = 1 << 62;

fn at_max_u32(field: &str, v: u32) -> Result<(), String> {
    if v == u32::MAX {
        Err(format!("`{field}` is {v}, a count brood never reaches"))
    } else {
        Ok(())
    }
}

fn not_empty(field: &str, v: &str) -> Result<(), String> {
    if v.is_empty() {
        Err(format!("`{field}` is empty"))
    } else {
        Ok(())
    }
}

impl CheckRow for SessionRow {
    fn check(&self) -> Result<(), String> {
        not_empty("session_id", &self.session_id)?;
        if self.max_concurrent_children == 0 || self.max_delivery_attempts == 0 {
            return Err("a limit of the session is 0".into());
        }
        at_max_u32("max_concurrent_children", self.max_concurrent_children)?;
        at_max_u32("max_delivery_attempts", self.max_delivery_attempts)?;
        if self.next_set == 0 || self.next_set > MAX_SET {
            return Err(format!("`next_set` is {}, out of range", self.next_set));
        }
        Ok(())
    }
}

impl CheckRow for CallRow {
    fn check(&self) -> Result<(), String> {
        not_empty("call_id", &self.call_id)?;
        not_empty("session_id", &self.session_id)?;
        if self.tasks.is_empty() || self.tasks.len() >= u32::MAX as usize {
            return Err(format!("the call has {} tasks", self.tasks.len()));
        }
        if self.set == 0 || self.set >= MAX_SET {
            return Err(format!("`set` is {}, out of range", self.set));
        }
        if let Some(traceparent) = &self.traceparent {
            validate_traceparent(traceparent).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

impl CheckRow for UnitRow {
    fn check(&self) -> Result<(), String> {
        not_empty("unit_id", &self.unit_id)?;
        not_empty("call_id", &self.call_id)
    }
}

impl CheckRow for ChildRow {
    fn check(&self) -> Result<(), String> {
        if self.child_id != child_id(&self.call_id, self.task_index) {
            return Err(format!(
                "`child_id` {} does not match its call {} and task index {}",
                self.child_id, self.call_id, self.task_index
            ));
        }
        not_empty("session_id", &self.session_id)?;
        at_max_u32("attempt", self.attempt)?;
        at_max_u32("result.failed_attempts", self.result.failed_attempts)?;
        at_max_u32("notice.failed_attempts", self.notice.failed_attempts)
    }
}

impl CheckRow for ClaimRow {
    fn check(&self) -> Result<(), String> {
        not_empty("claim_id", &self.claim_id)?;
        not_empty("session_id", &self.session_id)?;
        at_max_u32("items", self.items)
    }
}

impl CheckRow for DeadLetterRow {
    fn check(&self) -> Result<(), String> {
        match parse_dedup_key(&self.dedup_key) {
            Some((child, kind)) if child == self.child_id && kind == self.kind => {}
            _ => {
                return Err(format!(
                    "`dedup_key` {} does not name its child and kind",
                    self.dedup_key
                ))
            }
        }
        at_max_u32("attempts", self.attempts)
    }
}

impl CheckRow for AckRow {
    fn check(&self) -> Result<(), String> {
        not_empty("claim_id", &self.claim_id)?;
        not_empty("session_id", &self.session_id)?;
        if let Some(bad) = self.items.iter().find(|k| parse_dedup_key(k).is_none()) {
            return Err(format!("item `{bad}` is not a dedup key"));
        }
        Ok(())
    }
}

impl CheckRow for StartRow {
    fn check(&self) -> Result<(), String> {
        not_empty("session_id", &self.session_id)?;
        not_empty("call_id", &self.call_id)?;
        if self.start_id.rsplit_once('/').map(|(c, _)| c) != Some(self.call_id.as_str()) {
            return Err(format!(
                "start id `{}` does not name its call `{}`",
                self.start_id, self.call_id
            ));
        }
        if self.tasks.is_empty() {
            return Err("the start names no task".into());
        }
        if self.tasks.windows(2).any(|w| w[0] >= w[1]) {
            return Err("the start's task indices are not strictly ascending".into());
        }
        Ok(())
    }
}

impl CheckRow for NestRow {
    fn check(&self) -> Result<(), String> {
        not_empty("parent_session_id", &self.parent_session_id)?;
        if nest_parent(&self.session_id).is_none() {
            return Err(format!("`session_id` {:?} names no child", self.session_id));
        }
        if self.depth == 0 || self.depth == u32::MAX {
            return Err(format!("`depth` is {}, out of range", self.depth));
        }
        Ok(())
    }
}

impl CheckRow for RedriveRow {
    fn check(&self) -> Result<(), String> {
        not_empty("session_id", &self.session_id)?;
        if parse_dedup_key(&self.dedup_key).is_none() {
            return Err(format!("`dedup_key` {:?} names no item", self.dedup_key));
        }
        at_max_u32("count", self.count)
    }
}

impl CheckRow for WakeRow {
    fn check(&self) -> Result<(), String> {
        not_empty("session_id", &self.session_id)?;
        not_empty("url", &self.url)
    }
}

impl CheckRow for QuarantineRow {
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

impl CheckRow for u8 {
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}
