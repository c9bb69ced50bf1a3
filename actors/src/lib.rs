//! # brood-actors
//!
//! The engine of brood: durable, turn-boundary routing of delegated child work. A parent
//! session delegates a *call* of tasks; each task runs as a *child* inside a completion *unit*;
//! every terminal child is written to the ledger and flushed before anything publishes it
//! (I1); a unit's results become *ready items* together when its last child ends, and a
//! failure inside an incomplete unit publishes an early failure notice at once. At a turn
//! boundary a consumer *claims* every ready item of the session in one envelope, then acks or
//! releases the claim.
//!
//! The crate holds the model ([`model`]), the durable format ([`codec`]), the ledger trait and
//! its sled implementation ([`ledger`]), the pure routing decisions ([`routing`]), the runner
//! and wake traits ([`runner`], [`wake`]) and the actix actors ([`actors`]). The `brood` crate
//! wraps it in an embedding API, built-in runners, rendering and a CLI; most users start there.
//!
//! ```
//! use brood_actors::routing::{Router, ReleaseReason};
//!
//! let mut router: Router<&str> = Router::new(8);
//! router.publish("deleg_1.0:result", 0, 0);
//! let claim = router.claim(0, "c1".into(), 30_000).expect("one item is ready");
//! assert_eq!(claim.items, vec![("deleg_1.0:result", 1)]);
//! router.release(10, "c1", ReleaseReason::Busy, 0).unwrap();
//! assert_eq!(router.claim(20, "c2".into(), 30_000).unwrap().items.len(), 1);
//! ```
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms, unreachable_pub)]
#![deny(unused_must_use)]

pub mod actors;
pub mod codec;
pub mod error;
pub mod events;
pub mod failpoints;
pub mod ledger;
pub mod model;
mod parallel;
pub mod recovery;
pub mod retention;
pub mod routing;
pub mod runner;
pub mod text;
pub mod totals;
pub mod wake;
