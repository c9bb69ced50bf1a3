//! `GET /metrics`: the server's metrics in the OpenMetrics text format (`prometheus-client`),
//! and the middleware that counts every HTTP request.
//!
//! Three kinds of metric:
//! - counted as things happen, in [`Metrics`]: HTTP requests by matched route pattern, method
//!   and status (`brood_http_requests_total`; a path no route matches is `route="unmatched"`,
//!   so a client cannot grow the label set); webhook wakes delivered, tries failed and wakes
//!   given up, refused, parked for a slot or dropped (counted by
//!   [`Webhooks`](super::wake::Webhooks)); the ledger flush latency,
//!   fsync included (`brood_ledger_flush_seconds`, from [`BroodConfig::on_flush`]); the two
//!   stages of an item's delivery (`brood_item_end_to_ready_seconds`,
//!   `brood_item_ready_to_ack_seconds`, from [`BroodConfig::on_delivery_timing`]).
//! - the engine's running totals, read at each scrape ([`Brood::totals`]): children ended by
//!   status, items delivered by kind, wakes, redriven items, retries. Counters (`_total`) that
//!   only grow from the process's start (a restart starts them from 0), so they plot as rates.
//! - gathered from the engine at each scrape: sessions (and those given up after their owner
//!   kept failing), children by status, ready, backing-off and claimed items, items delivered,
//!   dead letters and quarantined rows. These are gauges of
//!   what the engine holds right now. In particular `brood_children{status="succeeded"}` (and
//!   every other terminal status) counts the children of the calls still in memory — those not
//!   yet delivered whole — not every child that ever ended (that is
//!   `brood_children_ended_total`): a delivered call leaves memory. `brood_claimed_items` counts
//!   items in live claims (the engine counts claimed items, not claims).
//!
//! This module owns no engine state and changes none: a scrape only reads.
//!
//! [`BroodConfig::on_flush`]: brood::BroodConfig::on_flush
//! [`BroodConfig::on_delivery_timing`]: brood::BroodConfig::on_delivery_timing

use std::collections::HashMap;
use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::{web, HttpResponse};
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use super::api::ApiError;
use super::state::State;
use super::wake::WakeCounts;
use brood::{Brood, BroodError, ChildStatus, DeliveryStage, ItemKind, Totals};

/// The Content-Type of the OpenMetrics text format.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `route` label of a request no route matched.
const UNMATCHED: &str = "unmatched";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    route: String,
    method: &'static str,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// What became of a request for a session another process serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Forwarded {
    /// Sent on to the holder, and its answer relayed.
    Relayed,
    /// An event stream, redirected (307) to the holder.
    Redirected,
    /// The holder did not answer (or refused the peer credential): answered 503 or 502 here.
    Failed,
    /// It had come from another process already: answered 503 `session_moved`, not sent on.
    Bounced,
}

impl Forwarded {
    const ALL: [Forwarded; 4] = [
        Forwarded::Relayed,
        Forwarded::Redirected,
        Forwarded::Failed,
        Forwarded::Bounced,
    ];

    fn label(self) -> &'static str {
        match self {
            Forwarded::Relayed => "relayed",
            Forwarded::Redirected => "redirected",
            Forwarded::Failed => "failed",
            Forwarded::Bounced => "bounced",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// The buckets of an item's delivery stages: 0.5 ms to about 4.4 minutes, doubling.
fn delivery_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.000_5, 2.0, 20)
}

/// The metrics counted as things happen, registered once.
#[derive(Debug)]
pub(super) struct Metrics {
    registry: Registry,
    http: Family<HttpLabels, Counter>,
    forwarded: Family<OutcomeLabel, Counter>,
    wakes: WakeCounts,
    flush: Histogram,
    end_to_ready: Histogram,
    ready_to_ack: Histogram,
}

impl Metrics {
    pub(super) fn new() -> Self {
        let mut registry = Registry::default();
        let http = Family::<HttpLabels, Counter>::default();
        registry.register(
            "brood_http_requests",
            "HTTP requests answered, by matched route pattern, method and status",
            http.clone(),
        );
        let forwarded = Family::<OutcomeLabel, Counter>::default();
        // Each outcome shown from the start, at 0: a rate plots from the first scrape.
        for outcome in Forwarded::ALL {
            let _ = forwarded.get_or_create(&OutcomeLabel {
                outcome: outcome.label(),
            });
        }
        registry.register(
            "brood_requests_forwarded",
            "Requests for a session another process serves, by outcome: relayed (sent on to the holder and its answer returned), redirected (an event stream), failed (the holder did not answer), bounced (forwarded here already, answered 503)",
            forwarded.clone(),
        );
        let wakes = WakeCounts::default();
        registry.register(
            "brood_wakes_delivered",
            "Webhook wakes a receiver accepted",
            wakes.delivered.clone(),
        );
        registry.register(
            "brood_wake_tries_failed",
            "Webhook wake tries that failed (no answer, or not 2xx); each is retried until the last",
            wakes.failed_tries.clone(),
        );
        registry.register(
            "brood_wakes_given_up",
            "Webhook wakes given up after their last try (the items stay ready)",
            wakes.given_up.clone(),
        );
        registry.register(
            "brood_wakes_refused",
            "Webhook wakes not sent: every address of their target is refused (see wake_allow)",
            wakes.refused.clone(),
        );
        registry.register(
            "brood_wakes_parked",
            "Webhook wakes that waited for a slot: as many as are allowed were in flight, to all hosts or to theirs",
            wakes.parked.clone(),
        );
        registry.register(
            "brood_wakes_dropped",
            "Webhook wakes dropped because as many sessions' wakes as are allowed waited for a slot (the items stay ready)",
            wakes.dropped.clone(),
        );
        // 100 µs to about 3.3 s.
        let flush = Histogram::new(exponential_buckets(0.000_1, 2.0, 16));
        registry.register_with_unit(
            "brood_ledger_flush",
            "Latency of successful ledger flushes, fsync included",
            Unit::Seconds,
            flush.clone(),
        );
        let end_to_ready = Histogram::new(delivery_buckets());
        registry.register_with_unit(
            "brood_item_end_to_ready",
            "Time from a child's end to its item being claimable (a result waits for its unit's last child), for items made ready by a child's end in this process",
            Unit::Seconds,
            end_to_ready.clone(),
        );
        let ready_to_ack = Histogram::new(delivery_buckets());
        registry.register_with_unit(
            "brood_item_ready_to_ack",
            "Time from an item being first claimable in this process (published or redriven) to the ack that delivered it",
            Unit::Seconds,
            ready_to_ack.clone(),
        );
        Metrics {
            registry,
            http,
            forwarded,
            wakes,
            flush,
            end_to_ready,
            ready_to_ack,
        }
    }

    /// Counts a request for a session another process serves.
    pub(super) fn forwarded(&self, outcome: Forwarded) {
        self.forwarded
            .get_or_create(&OutcomeLabel {
                outcome: outcome.label(),
            })
            .inc();
    }

    /// The counts the server's webhooks add to.
    pub(super) fn wakes(&self) -> WakeCounts {
        self.wakes.clone()
    }

    /// What the engine calls after each successful ledger flush.
    pub(super) fn flush_observer(&self) -> impl Fn(Duration) + Send + Sync + 'static {
        let flush = self.flush.clone();
        move |took| flush.observe(took.as_secs_f64())
    }

    /// What the engine calls as each item ends a stage of its delivery.
    pub(super) fn delivery_observer(&self) -> impl Fn(DeliveryStage, Duration) + Send + Sync + 'static {
        let (end_to_ready, ready_to_ack) = (self.end_to_ready.clone(), self.ready_to_ack.clone());
        move |stage, took| match stage {
            DeliveryStage::EndToReady => end_to_ready.observe(took.as_secs_f64()),
            DeliveryStage::ReadyToAck => ready_to_ack.observe(took.as_secs_f64()),
        }
    }
}

/// What the engine holds, gathered for one scrape.
#[derive(Debug, Default)]
struct Engine {
    sessions: i64,
    failed_sessions: i64,
    children: HashMap<ChildStatus, i64>,
    ready: i64,
    backing_off: i64,
    claimed: i64,
    delivered: i64,
    dead_letters: i64,
    quarantined: i64,
    totals: Totals,
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Engine {
    /// Reads every session's status. A session that stops answering between being listed and
    /// being asked is left out; an engine that stopped or a ledger that fails is an error.
    async fn gather(brood: &Brood) -> Result<Engine, BroodError> {
        let mut engine = Engine {
            totals: brood.totals(),
            ..Engine::default()
        };
        for session_id in brood.sessions() {
            let st = match brood.status(&session_id).await {
                Ok(st) => st,
                Err(e @ (BroodError::Stopped | BroodError::Ledger(_))) => return Err(e),
                Err(e) => {
                    tracing::debug!(session = %session_id, "left out of the metrics: {e}");
                    continue;
                }
            };
            engine.sessions += 1;
            *engine.children.entry(ChildStatus::Queued).or_default() += gauge(st.counts.queued);
            *engine.children.entry(ChildStatus::Running).or_default() += gauge(st.counts.running);
            let ended = st
                .calls
                .iter()
                .flat_map(|c| &c.children)
                .filter(|c| c.status.is_terminal());
            for child in ended {
                *engine.children.entry(child.status).or_default() += 1;
            }
            engine.ready += gauge(st.counts.ready);
            engine.backing_off += gauge(st.counts.backing_off);
            engine.claimed += gauge(st.counts.claimed);
            engine.delivered = engine
                .delivered
                .saturating_add(i64::try_from(st.counts.delivered).unwrap_or(i64::MAX));
        }
        engine.failed_sessions = gauge(brood.health().await?.failed_sessions);
        engine.dead_letters = i64::try_from(brood.dead_letter_total().await?).unwrap_or(i64::MAX);
        engine.quarantined = gauge(brood.quarantined()?.len());
        Ok(engine)
    }

    fn registry(&self) -> Registry {
        let mut registry = Registry::default();
        let one = |registry: &mut Registry, name: &str, help: &str, value: i64| {
            let g = Gauge::<i64>::default();
            g.set(value);
            registry.register(name, help, g);
        };
        one(
            &mut registry,
            "brood_sessions",
            "Sessions the engine routes",
            self.sessions,
        );
        one(
            &mut registry,
            "brood_failed_sessions",
            "Sessions given up after their owner kept failing",
            self.failed_sessions,
        );
        let children = Family::<StatusLabel, Gauge>::default();
        for status in ChildStatus::ALL {
            let n = self.children.get(&status).copied().unwrap_or(0);
            children
                .get_or_create(&StatusLabel {
                    status: status.as_str(),
                })
                .set(n);
        }
        registry.register(
            "brood_children",
            "Children by status: queued and running ones, and the ended children of calls not yet delivered whole",
            children,
        );
        one(&mut registry, "brood_ready_items", "Items claimable now", self.ready);
        one(
            &mut registry,
            "brood_backing_off_items",
            "Items waiting out a backoff before they are ready again",
            self.backing_off,
        );
        one(
            &mut registry,
            "brood_claimed_items",
            "Items in live claims",
            self.claimed,
        );
        one(
            &mut registry,
            "brood_delivered_items",
            "Items delivered in the sessions the engine routes",
            self.delivered,
        );
        one(
            &mut registry,
            "brood_dead_letters",
            "Items that ran out of delivery attempts",
            self.dead_letters,
        );
        one(
            &mut registry,
            "brood_quarantined_rows",
            "Ledger rows that could not be read back and were quarantined",
            self.quarantined,
        );
        self.register_totals(&mut registry);
        registry
    }

    /// The engine's running totals, as counters.
    fn register_totals(&self, registry: &mut Registry) {
        let t = &self.totals;
        let ended = Family::<StatusLabel, Counter>::default();
        for status in ChildStatus::ALL.into_iter().filter(|s| s.is_terminal()) {
            ended
                .get_or_create(&StatusLabel {
                    status: status.as_str(),
                })
                .inc_by(t.ended(status));
        }
        registry.register(
            "brood_children_ended",
            "Children ended since the process started, by status (a child a retry policy ran again counts once, as its last attempt ended)",
            ended,
        );
        let delivered = Family::<KindLabel, Counter>::default();
        for kind in [ItemKind::Result, ItemKind::FailureNotice] {
            delivered
                .get_or_create(&KindLabel { kind: kind.as_str() })
                .inc_by(t.delivered(kind));
        }
        registry.register(
            "brood_items_delivered",
            "Items delivered since the process started (acked, or received inline by a sync call's caller), by kind",
            delivered,
        );
        let one = |registry: &mut Registry, name: &str, help: &str, value: u64| {
            let c = Counter::<u64>::default();
            c.inc_by(value);
            registry.register(name, help, c);
        };
        one(
            registry,
            "brood_wakes",
            "Wakes fired since the process started: a session idle with ready items woken once, whatever its wake target",
            t.wakes,
        );
        one(
            registry,
            "brood_items_redriven",
            "Dead letters put back in their session's ready set since the process started",
            t.redriven,
        );
        one(
            registry,
            "brood_child_retries",
            "Children run again by their task's retry policy since the process started",
            t.retries,
        );
    }
}

/// `GET /metrics`.
#[utoipa::path(
    get, path = "/metrics", operation_id = "metrics",
    responses((status = 200, description = "The metrics, in OpenMetrics text.", content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8", body = String))
)]
pub(super) async fn scrape(state: web::Data<State>, metrics: web::Data<Metrics>) -> Result<HttpResponse, ApiError> {
    let engine = Engine::gather(&state.brood).await?;
    let mut text = String::new();
    encode_registry(&mut text, &metrics.registry)
        .and_then(|_| encode_registry(&mut text, &engine.registry()))
        .and_then(|_| encode_eof(&mut text))
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "metrics_unencodable",
                format!("the metrics could not be encoded: {e}"),
            )
        })?;
    Ok(HttpResponse::Ok().content_type(CONTENT_TYPE).body(text))
}

/// A method as a label: the standard ones by name, anything else as `other`.
fn method_label(method: &Method) -> &'static str {
    const KNOWN: [(Method, &str); 7] = [
        (Method::GET, "GET"),
        (Method::PUT, "PUT"),
        (Method::POST, "POST"),
        (Method::DELETE, "DELETE"),
        (Method::HEAD, "HEAD"),
        (Method::OPTIONS, "OPTIONS"),
        (Method::PATCH, "PATCH"),
    ];
    KNOWN
        .iter()
        .find(|(m, _)| m == method)
        .map_or("other", |(_, name)| name)
}

/// Counts every request by its matched route pattern (never its raw path), method and status.
pub(super) async fn count_requests(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let metrics = req.app_data::<web::Data<Metrics>>().cloned();
    let route = req.match_pattern().unwrap_or_else(|| UNMATCHED.to_string());
    let method = method_label(req.method());
    let answered = next.call(req).await;
    if let Some(metrics) = metrics {
        let status = match &answered {
            Ok(res) => res.status(),
            Err(e) => e.as_response_error().status_code(),
        };
        let labels = HttpLabels {
            route,
            method,
            status: status.as_u16(),
        };
        metrics.http.get_or_create(&labels).inc();
    }
    answered
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unusual_methods_share_one_label() {
        assert_eq!(method_label(&Method::POST), "POST");
        assert_eq!(method_label(&Method::from_bytes(b"BREW").unwrap()), "other");
    }
}
