//! Dead-letter redrive: items that ran out of delivery attempts are put back in the session's
//! ready set with their attempts counted afresh.
//!
//! What the decision needs from the ledger is read first, off the actor thread: each item's
//! redrive record, and the rows of calls that left memory once everything in them was
//! delivered or dead. The decision then checks each item is still dead (a concurrent redrive
//! may have taken it), and one durable step removes the dead letters, rewrites the children's
//! rows with their attempts reset and records the redrive; only then do the items become
//! ready (a call that had left memory comes back into it, complete, for as long as its items
//! are out).

use std::collections::{BTreeMap, HashMap};

use actix::prelude::*;
use tokio::sync::oneshot;

use super::apply::Apply;
use super::persist::{BatchView, Decided, Step};
use super::{answer, Durable, SessionOwner};
use crate::error::BroodError;
use crate::ledger::{off_thread, settled_children, Ledger, LedgerError, Writes};
use crate::model::*;

/// Put these dead letters of the session back in its ready set. Answers how many were.
#[derive(Debug, Message)]
#[rtype(result = "Result<usize, BroodError>")]
pub struct Redrive {
    /// The dead letters to redrive (of this session).
    pub selected: Vec<DeadLetterRow>,
}

/// What a redrive read from the ledger before it is decided.
pub(super) struct Loaded {
    selected: Vec<DeadLetterRow>,
    /// Redrive records, by dedup key.
    records: HashMap<String, RedriveRow>,
    /// Calls no longer in memory, with their children's rows as they were when the call left
    /// memory.
    calls: HashMap<String, (CallRow, Vec<ChildRow>)>,
}

/// Reads what deciding a redrive of `selected` needs.
fn load(
    ledger: &dyn Ledger,
    session: &str,
    selected: Vec<DeadLetterRow>,
    absent: Vec<String>,
) -> Result<Loaded, LedgerError> {
    let mut records = HashMap::new();
    for d in &selected {
        if let Some(r) = ledger.redrive(session, &d.dedup_key)? {
            records.insert(d.dedup_key.clone(), r);
        }
    }
    let mut calls = HashMap::new();
    for call_id in absent {
        if let Some(row) = ledger.call(session, &call_id)? {
            let children = settled_children(ledger, session, &call_id)?;
            calls.insert(call_id, (row, children));
        }
    }
    Ok(Loaded {
        selected,
        records,
        calls,
    })
}

/// A redrive, to apply once it is durable.
pub(super) struct Redriven {
    /// Calls that had left memory, with their children's rows, that come back for it.
    back: BTreeMap<String, (CallRow, Vec<ChildRow>)>,
    /// The children's rows with their attempts reset.
    after: Vec<ChildRow>,
    /// The items made ready again.
    items: Vec<String>,
    reply: oneshot::Sender<Result<usize, BroodError>>,
}

impl SessionOwner {
    /// Reads what the redrive needs, then submits it to be decided.
    pub(super) fn redrive(
        &mut self,
        msg: Redrive,
        ctx: &mut Context<Self>,
    ) -> oneshot::Receiver<Result<usize, BroodError>> {
        let (tx, rx) = oneshot::channel();
        let mut absent: Vec<String> = msg
            .selected
            .iter()
            .map(|d| d.call_id.clone())
            .filter(|c| !self.owed.calls.contains_key(c))
            .collect();
        absent.sort();
        absent.dedup();
        let ledger = self.engine.ledger.clone();
        let session = self.session.session_id.clone();
        let read = off_thread("the redrive's read", move || {
            load(&*ledger, &session, msg.selected, absent)
        });
        ctx.spawn(read.into_actor(self).map(move |loaded, act, ctx| match loaded {
            Ok(loaded) => act.submit(Durable::Redrive(loaded, tx), ctx),
            Err(e) => answer(tx, Err(e.into())),
        }));
        rx
    }

    /// Decides a redrive: the items still dead, their dead letters removed, their children's
    /// rows rewritten with the attempts reset, a redrive recorded for each; applied (the items
    /// ready again) once durable.
    pub(super) fn decide_redrive(
        &mut self,
        loaded: Loaded,
        reply: oneshot::Sender<Result<usize, BroodError>>,
        view: &mut BatchView,
    ) -> Decided<Durable> {
        if loaded.selected.iter().any(|d| view.redriven.contains(&d.dedup_key)) {
            return Decided::Later(Durable::Redrive(loaded, reply));
        }
        let Loaded {
            selected,
            records,
            calls,
        } = loaded;
        let now = now_ms();
        let (mut writes, mut restore) = (Writes::default(), Writes::default());
        // Each child's row before and after, once however many of its items are redriven.
        let mut rows: BTreeMap<String, (ChildRow, ChildRow)> = BTreeMap::new();
        let mut back: BTreeMap<String, (CallRow, Vec<ChildRow>)> = BTreeMap::new();
        let mut items = Vec::new();
        for dead in selected {
            let Some((child, kind)) = parse_dedup_key(&dead.dedup_key) else {
                continue;
            };
            if dead.session_id != self.session.session_id {
                continue;
            }
            let before = match rows.get(child) {
                Some((before, _)) => before.clone(),
                None => match self.owed.child(child) {
                    Some(row) if row.delivery(kind).dead => row.clone(),
                    // Not dead (any more): redriven by another request, or never dead.
                    Some(_) => continue,
                    None => {
                        if view.pruned.contains(&dead.call_id) {
                            continue; // retention removes it in this very batch
                        }
                        let Some((call, children)) = calls.get(&dead.call_id) else {
                            continue;
                        };
                        // Removed by retention since it was read: nothing to bring back.
                        if !back.contains_key(&dead.call_id)
                            && !matches!(
                                self.engine.ledger.call(&self.session.session_id, &dead.call_id),
                                Ok(Some(_))
                            )
                        {
                            continue;
                        }
                        let returned = back
                            .entry(dead.call_id.clone())
                            .or_insert_with(|| (call.clone(), children.clone()));
                        match returned.1.iter().find(|r| r.child_id == child) {
                            Some(row) => row.clone(),
                            None => continue,
                        }
                    }
                },
            };
            let mut after = rows.get(child).map_or_else(|| before.clone(), |(_, a)| a.clone());
            let d = after.delivery_mut(kind);
            if !d.dead {
                continue;
            }
            d.dead = false;
            d.failed_attempts = 0;
            rows.insert(child.to_string(), (before, after));
            let key = self.row_key(&dead.dedup_key);
            writes.remove_dead_letters.push(key.clone());
            let previous = records.get(&dead.dedup_key).cloned();
            writes.redrives.push(RedriveRow::after(previous.clone(), &dead, now));
            match previous {
                Some(p) => restore.redrives.push(p),
                None => restore.remove_redrives.push(key),
            }
            items.push(dead.dedup_key.clone());
            restore.dead_letters.push(dead);
        }
        if items.is_empty() {
            answer(reply, Ok(0));
            return Decided::Done;
        }
        view.redriven.extend(items.iter().cloned());
        view.revived.extend(back.keys().cloned());
        let (before, after): (Vec<ChildRow>, Vec<ChildRow>) = rows.into_values().unzip();
        writes.children = after.clone();
        restore.children = before;
        Decided::Step(Step {
            writes,
            restore,
            apply: Apply::Redrive(Box::new(Redriven {
                back,
                after,
                items,
                reply,
            })),
        })
    }

    /// Applies a redrive once it is durable: calls that had left memory come back, the
    /// children's rows have their attempts reset, and the items are ready again.
    pub(super) fn apply_redrive(&mut self, r: Redriven, res: Result<(), BroodError>, ctx: &mut Context<Self>) {
        if let Err(e) = res {
            return answer(r.reply, Err(e));
        }
        for (_, (call, children)) in r.back {
            self.bring_back(call, children);
        }
        for row in r.after {
            self.owed.put_child(row);
        }
        let n = r.items.len();
        let now = now_ms();
        for key in r.items {
            self.router.revive(key, now);
        }
        self.engine.counters.redriven(n as u64);
        tracing::info!(items = n, "dead letters redriven");
        self.after_change(ctx);
        answer(r.reply, Ok(n));
    }

    /// A call that had left memory (everything in it delivered or dead) comes back, complete,
    /// for items of it that are out again.
    fn bring_back(&mut self, call: CallRow, children: Vec<ChildRow>) {
        if self.owed.calls.contains_key(&call.call_id) {
            return;
        }
        let units = plan_units(&call.call_id, &call.tasks, call.independent_completions)
            .into_iter()
            .map(|u| {
                let n = u.tasks.len();
                (u, n, None)
            })
            .collect();
        self.engine
            .calls
            .insert(call.call_id.clone(), self.session.session_id.clone());
        self.owed.bring_back(call, units, children);
    }
}
