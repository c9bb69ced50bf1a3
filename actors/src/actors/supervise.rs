//! Supervision policy for actix actors.
//!
//! actix does not restart an actor whose handler panicked: the actor's task dies and its
//! mailbox closes. brood therefore runs each supervised actor as a task of its own
//! ([`spawn`]), watches that task's join result, and applies an explicit [`RestartPolicy`]:
//! at most `max_restarts` restarts within `within`, then the failure escalates to the parent.
//! The decision is the pure [`RestartBudget`]; what a restart rebuilds is the parent's business
//! (every supervised actor rebuilds its state from the ledger).
//!
//! Every actor started here runs inside the one tracing span it is given, named for it and
//! with its ids as fields: the span is entered around each poll of the actor's task, so its
//! handlers, its timers and the futures it spawned in its context log inside it, and the
//! actors it starts take it as their parent. When no subscriber is interested the span is
//! disabled, and entering it costs a branch.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_rt::ArbiterHandle;
use futures::future::{BoxFuture, LocalBoxFuture};
use tokio::sync::oneshot;
use tracing::{Instrument, Span};

/// At most `max_restarts` restarts within `within`; one more failure escalates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Restarts allowed inside the window.
    pub max_restarts: u32,
    /// The window.
    pub within: Duration,
}

impl Default for RestartPolicy {
    /// Three restarts within ten seconds.
    fn default() -> Self {
        RestartPolicy {
            max_restarts: 3,
            within: Duration::from_secs(10),
        }
    }
}

/// What to do about a failed actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Start it again, rebuilt from the ledger.
    Restart,
    /// It failed too often: hand the failure to the parent instead of looping.
    Escalate,
}

/// The restart history of one supervised actor.
#[derive(Debug, Clone)]
pub struct RestartBudget {
    policy: RestartPolicy,
    restarts: VecDeque<Instant>,
}

impl RestartBudget {
    /// A fresh budget.
    pub fn new(policy: RestartPolicy) -> Self {
        RestartBudget {
            policy,
            restarts: VecDeque::new(),
        }
    }

    /// Records a failure at `now` and decides.
    pub fn on_failure(&mut self, now: Instant) -> Decision {
        while let Some(&first) = self.restarts.front() {
            if now.duration_since(first) > self.policy.within {
                self.restarts.pop_front();
            } else {
                break;
            }
        }
        if self.restarts.len() < self.policy.max_restarts as usize {
            self.restarts.push_back(now);
            Decision::Restart
        } else {
            Decision::Escalate
        }
    }
}

/// The restart histories of a family of supervised actors (one per key), under one policy.
#[derive(Debug, Clone)]
pub struct RestartBudgets {
    policy: RestartPolicy,
    budgets: std::collections::HashMap<String, RestartBudget>,
}

impl RestartBudgets {
    /// No failures yet.
    pub fn new(policy: RestartPolicy) -> Self {
        RestartBudgets {
            policy,
            budgets: std::collections::HashMap::new(),
        }
    }

    /// Records a failure of the actor `key` at `now` and decides.
    pub fn on_failure(&mut self, key: &str, now: Instant) -> Decision {
        let policy = self.policy;
        self.budgets
            .entry(key.to_string())
            .or_insert_with(|| RestartBudget::new(policy))
            .on_failure(now)
    }
}

/// How a supervised actor's task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// It stopped on its own (or the system is stopping).
    Stopped,
    /// A handler panicked; the message.
    Panicked(String),
}

/// Starts `actor`, unsupervised, as a task of its own inside `span`, and returns its address
/// (the root of the tree: nobody restarts it).
pub fn start<A>(actor: A, span: Span) -> Addr<A>
where
    A: Actor<Context = Context<A>>,
{
    let ctx = Context::new();
    let addr = ctx.address();
    actix::spawn(ctx.into_future(actor).instrument(span));
    addr
}

/// Starts `actor` as a task of its own inside `span` and returns its address and a future that
/// resolves, when the actor's task ends, to how it ended.
pub fn spawn<A>(actor: A, span: Span) -> (Addr<A>, LocalBoxFuture<'static, Exit>)
where
    A: Actor<Context = Context<A>>,
{
    let (addr, mailbox) = self::mailbox();
    let (exit_tx, exit_rx) = oneshot::channel();
    run_here(mailbox, actor, span, move |exit| {
        let _ = exit_tx.send(exit);
    });
    (addr, Box::pin(async move { exit_rx.await.unwrap_or(Exit::Stopped) }))
}

/// As [`spawn`], on another arbiter (thread): the actor is made there by `make`.
pub fn spawn_in<A, F>(arbiter: &ArbiterHandle, span: Span, make: F) -> (Addr<A>, BoxFuture<'static, Exit>)
where
    A: Actor<Context = Context<A>>,
    F: FnOnce() -> A + Send + 'static,
{
    let (addr, mailbox) = self::mailbox();
    let (exit_tx, exit_rx) = oneshot::channel();
    let started = arbiter.spawn_fn(move || {
        run_here(mailbox, make(), span, move |exit| {
            let _ = exit_tx.send(exit);
        })
    });
    if !started {
        tracing::warn!("the arbiter is gone; the actor was not started");
    }
    (addr, Box::pin(async move { exit_rx.await.unwrap_or(Exit::Stopped) }))
}

/// The receiving end of an actor's mailbox, for [`run_here`] to start the actor on.
pub type Mailbox<A> = actix::dev::channel::AddressReceiver<A>;

/// A mailbox and its address, for an actor that another thread starts later ([`run_here`]):
/// messages sent meanwhile wait in it.
pub fn mailbox<A>() -> (Addr<A>, Mailbox<A>)
where
    A: Actor<Context = Context<A>>,
{
    let (tx, rx) = actix::dev::channel::channel(16);
    (Addr::new(tx), rx)
}

/// Starts `actor` on this thread's arbiter as a task of its own inside `span`, reading
/// `mailbox`; `on_exit` is told, on this thread, how the task ended. Used to start many actors
/// made elsewhere in one hop (their parent's thread only makes the mailboxes and spans).
pub fn run_here<A>(mailbox: Mailbox<A>, actor: A, span: Span, on_exit: impl FnOnce(Exit) + 'static)
where
    A: Actor<Context = Context<A>>,
{
    use futures::FutureExt;
    let ctx = Context::with_receiver(mailbox);
    // One task, not the actor's and a watcher's: a panic in a handler unwinds out of the
    // actor's future into `catch_unwind`, which drops the actor (its mailbox closes) and tells
    // `on_exit`.
    // A combinator, not an async block: an async block awaiting the actor it captured would
    // hold room for it twice.
    let task = std::panic::AssertUnwindSafe(ctx.into_future(actor).instrument(span))
        .catch_unwind()
        .map(move |ended| {
            on_exit(match ended {
                Ok(()) => Exit::Stopped,
                Err(panic) => Exit::Panicked(crate::model::panic_message(panic)),
            })
        });
    actix::spawn(task);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_within_the_budget_then_escalates() {
        let mut b = RestartBudget::new(RestartPolicy {
            max_restarts: 2,
            within: Duration::from_secs(10),
        });
        let t = Instant::now();
        assert_eq!(b.on_failure(t), Decision::Restart);
        assert_eq!(b.on_failure(t + Duration::from_secs(1)), Decision::Restart);
        assert_eq!(b.on_failure(t + Duration::from_secs(2)), Decision::Escalate);
        // Old restarts leave the window.
        assert_eq!(b.on_failure(t + Duration::from_secs(12)), Decision::Restart);
    }
}
