//! `brood serve`: API.md over HTTP (actix-web), on the embedded engine.
//!
//! [`config`] resolves the configuration (defaults, file, environment, flags); `api` holds the
//! JSON shapes and the error reply; `routes` the endpoints; `workers` those of outside workers;
//! `metrics` `GET /metrics` and the request counts; `openapi` the OpenAPI document; `guard` the
//! refusal of requests from web pages of other sites (Host, Origin, body type); [`mcp`] the
//! Model Context Protocol at `POST /mcp`. This module builds the app: the guard around
//! everything, the key check on every `/v1` and `/mcp` request (constant time) inside it, the
//! bounded read of its body (`intake`: the body limit and `body_timeout_ms`), the routes, a 404
//! in API.md's shape for anything else, and a graceful stop on SIGINT/SIGTERM.
//!
//! The stop drains first: new calls are refused (503 `draining`), event streams end, no queued
//! child starts (queued ones stay queued, durably, for the next start), and the children that
//! are running are given up to `drain_timeout_ms` to end — their results recorded, and still
//! claimable, ackable and (for external workers) completable over HTTP meanwhile. Then the
//! server stops accepting connections, requests still in flight get a few seconds, and the
//! engine flushes and closes. A child still running at the end is resolved by the next start
//! as any interrupted child is (DESIGN.md, I6).
//!
//! The engine runs the runner kinds the configuration allows (`allowed_runners`): `sim`,
//! `command`, and `external`, whose work queues the worker endpoints share. Before the engine
//! opens (and re-runs what it recovers), the process groups of `command` children an earlier
//! process on the data folder left running are killed ([`CommandGroups`]); a `command` child
//! gets only the variables `command_env` names from the server's environment.
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms, unreachable_pub)]
#![deny(unused_must_use)]

pub mod api;
pub mod config;
mod events;
mod forward;
mod guard;
mod intake;
mod listing;
pub mod mcp;
mod metrics;
mod openapi;
mod routes;
pub mod scope;
mod state;
pub mod wake;
mod workers;

pub use forward::HOLDER;

use std::sync::Arc;
use std::time::Duration;

use actix_web::body::EitherBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::middleware::Next;
use actix_web::{web, App, HttpServer};

use self::api::ApiError;
use self::config::ServeConfig;
use brood::runners::groups::CommandGroups;
use brood::runners::{CommandSettings, WorkQueues};
use brood::{Brood, BroodConfig, Runners};

/// The token of an `Authorization` header's value: its scheme is `Bearer` in any case (RFC 9110
/// §11.1: schemes are case-insensitive), then one or more spaces.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start_matches(' '))
}

/// Compares two byte strings in time that depends on neither (their SHA-256 digests are
/// compared, byte for byte, all of them), so the time taken tells nothing of a key, not even its
/// length.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use sha2::Digest as _;
    let (x, y) = (sha2::Sha256::digest(a), sha2::Sha256::digest(b));
    x.iter().zip(y.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What a request may touch, by the key it carries: everything for the server's key (and for
/// every request to a server without one), the sessions of its prefix for a scoped key; for
/// the peer credential of the processes sharing its ledger, what the request it forwards may
/// (its [`scope::SCOPE`]). None when the key is missing or wrong.
fn authenticated(config: &ServeConfig, req: &ServiceRequest) -> Option<scope::Access> {
    let Some(key) = &config.api_key else {
        return Some(scope::Access::All);
    };
    if let Some(given) = req.headers().get(forward::PEER) {
        let peer = config.peer_credential()?;
        if !constant_time_eq(given.as_bytes(), peer.as_bytes()) {
            return None;
        }
        return match req.headers().get(scope::SCOPE) {
            None => Some(scope::Access::All),
            Some(prefix) => prefix.to_str().ok().map(|p| scope::Access::Prefix(p.to_string())),
        };
    }
    let given = req
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .unwrap_or("");
    if constant_time_eq(given.as_bytes(), key.as_bytes()) {
        return Some(scope::Access::All);
    }
    // Every scoped key is compared, so the time taken tells nothing of which one came close.
    let mut found = None;
    for scoped in &config.scoped_keys {
        if constant_time_eq(given.as_bytes(), scoped.key.as_bytes()) {
            found = Some(scope::Access::Prefix(scoped.prefix.clone()));
        }
    }
    found
}

async fn require_key(
    req: ServiceRequest,
    next: Next<impl actix_web::body::MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl actix_web::body::MessageBody, intake::Unread>>, actix_web::Error> {
    use actix_web::HttpMessage as _;
    let config = req.app_data::<web::Data<state::State>>().map(|s| s.config.clone());
    let access = config.as_ref().and_then(|c| authenticated(c, &req));
    match access {
        Some(access) => {
            req.extensions_mut().insert(access);
        }
        None => {
            let e = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this server needs `Authorization: Bearer <key>` on every /v1 and /mcp request, and the key given is missing or wrong",
            );
            return Ok(intake::refuse_unread(req, &e).map_into_right_body());
        }
    }
    Ok(next.call(req).await?.map_into_left_body())
}

/// How long a connection may take to send a request's head (actix-web answers 408 and closes
/// after it); the body has its own bound, `body_timeout_ms` (see `intake`).
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a closing connection is given to shut down cleanly before it is dropped.
const DISCONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Seconds a request still in flight when the server stops accepting is given to finish.
const IN_FLIGHT_GRACE_S: u64 = 5;

/// Waits for SIGTERM or SIGINT; names the one that came.
async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        },
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!("cannot listen for SIGTERM/SIGINT ({e}); stop the server with SIGKILL");
            std::future::pending().await
        }
    }
}

/// The engine behind a server, from its configuration: `sim`, and `command` and `external`
/// when allowed, the latter on `queues`. What an earlier process on the data folder left of
/// its command children is killed first.
pub fn open_engine(config: &ServeConfig, queues: &Arc<WorkQueues>) -> std::io::Result<Brood> {
    let wakes = wake::Webhooks::allowing(&config.wake_allow).map_err(std::io::Error::other)?;
    let groups = sweep_command_groups(config)?;
    Brood::open(engine_config(config, wakes, queues, groups)).map_err(std::io::Error::other)
}

/// Locks the data folder's record of command groups, and kills the groups an earlier process
/// left running (see [`CommandGroups`]).
fn sweep_command_groups(config: &ServeConfig) -> std::io::Result<Arc<CommandGroups>> {
    let (groups, swept) = match config.ledger {
        // The data folder holds sled's ledger, which one process opens at a time.
        None => CommandGroups::open(&config.data_dir),
        // Servers on one database may be started in one folder: a record per listen address,
        // so a server restarted at its address finds what it left.
        Some(_) => CommandGroups::open_named(&config.data_dir, &groups_record(config.listen)),
    }
    .map_err(std::io::Error::other)?;
    if !swept.killed.is_empty() {
        tracing::warn!(
            groups = ?swept.killed,
            "killed the process groups of command children an earlier server left running"
        );
    }
    Ok(Arc::new(groups))
}

/// The name of the command-groups record of a server listening on `listen` beside others on
/// one PostgreSQL ledger: `command-groups-127.0.0.1-7070`.
fn groups_record(listen: std::net::SocketAddr) -> String {
    let address: String = listen
        .to_string()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '-' })
        .collect();
    format!("{}-{}", brood::runners::groups::FILE, address.trim_matches('-'))
}

/// The runner kinds the configuration allows: `sim` always registered (the routes refuse it
/// when not allowed), `command` and `external` only when allowed.
fn runners(config: &ServeConfig, queues: &Arc<WorkQueues>, groups: Arc<CommandGroups>) -> Runners {
    let mut runners = Runners::builtin();
    if config.refuses_runner("command").is_none() {
        runners.register_command_with(
            CommandSettings::new()
                .pass_env(config.command_env.clone())
                .record_groups(groups),
        );
    }
    if config.refuses_runner("external").is_none() {
        runners.register_external(queues.clone());
    }
    runners
}

fn engine_config(
    config: &ServeConfig,
    wakes: wake::Webhooks,
    queues: &Arc<WorkQueues>,
    groups: Arc<CommandGroups>,
) -> BroodConfig {
    let mut engine = BroodConfig::new(&config.data_dir);
    if let Some(url) = &config.ledger {
        // Every process on one database shares it: sessions are served under tenures.
        let address = config.advertised();
        let node = config.node.clone().unwrap_or_else(|| address.clone());
        engine = engine
            .postgres(url)
            .share(node, address, Duration::from_millis(config.session_lease_ms));
    }
    engine
        .runners(runners(config, queues, groups))
        .durability(config.durability)
        .commit_window(Duration::from_millis(config.commit_window_ms))
        .routing_threads(config.routing_threads)
        .cache_bytes(config.cache_bytes)
        .max_depth(config.max_depth)
        .max_running_children(config.max_running_children)
        .max_live_children(Some(config.max_live_children))
        .retention(config.retention())
        .wake_factory(wakes)
}

/// Arms the fault points `BROOD_FAILPOINTS` names (`name=hits,name=hits`), for tests that
/// drive a server process; only in a build with the `failpoints` feature.
#[cfg(feature = "failpoints")]
fn arm_failpoints_from_env() {
    let Ok(points) = std::env::var("BROOD_FAILPOINTS") else {
        return;
    };
    for point in points.split(',').filter(|p| !p.is_empty()) {
        let (name, hits) = point.split_once('=').unwrap_or((point, "1"));
        match (brood_actors::failpoints::known(name), hits.parse::<u64>()) {
            (Some(name), Ok(hits)) => brood_actors::failpoints::arm(name, hits),
            _ => {
                tracing::warn!(point = %point, "BROOD_FAILPOINTS names an unknown fault point or a bad count; ignored")
            }
        }
    }
}

/// Registers each path's methods, and for any other method a 405 naming them in `Allow`; and
/// lists the paths and methods (see [`routes`]: the OpenAPI document names the same, as
/// `tests/openapi.rs` checks).
macro_rules! route_table {
    ($configure:ident, $list:ident, $prefix:literal, [$($path:literal => { $($method:ident: $handler:path),+ $(,)? }),+ $(,)?]) => {
        fn $configure(cfg: &mut web::ServiceConfig) {
            $(
                cfg.service(
                    web::resource($path)
                        $(.route(web::$method().to($handler)))+
                        .default_service(web::to(|| routes::not_allowed(route_table!(@allow $($method),+)))),
                );
            )+
        }

        /// The paths of this table and their methods.
        const $list: &[(&str, &[&str])] = &[$((concat!($prefix, $path), &[$(route_table!(@upper $method)),+])),+];
    };
    (@allow $first:ident $(, $method:ident)*) => {
        concat!(route_table!(@upper $first) $(, ", ", route_table!(@upper $method))*)
    };
    (@upper get) => { "GET" };
    (@upper put) => { "PUT" };
    (@upper post) => { "POST" };
}

route_table!(top_routes, TOP_ROUTES, "", [
    "/healthz" => { get: routes::healthz },
    "/readyz" => { get: routes::readyz },
    "/metrics" => { get: metrics::scrape },
    "/ui" => { get: ui },
]);

route_table!(mcp_routes, MCP_ROUTES, "/mcp", [
    "" => { post: mcp::post },
]);

route_table!(v1_routes, V1_ROUTES, "/v1", [
    "/sessions" => { get: listing::list_sessions },
    "/sessions/{session_id}" => { put: routes::put_session, get: routes::get_session },
    "/sessions/{session_id}/turn" => { post: routes::set_turn },
    "/sessions/{session_id}/delegate" => { post: routes::delegate },
    "/sessions/{session_id}/boundary" => { post: routes::boundary },
    "/sessions/{session_id}/events" => { get: events::stream },
    "/sessions/{session_id}/deliveries" => { get: routes::list_deliveries },
    "/claims/{claim_id}/ack" => { post: routes::ack },
    "/claims/{claim_id}/release" => { post: routes::release },
    "/dead-letters" => { get: routes::dead_letters },
    "/dead-letters/redrive" => { post: routes::redrive },
    "/openapi.json" => { get: openapi::document },
    "/workers/poll" => { post: workers::poll },
    "/workers/take" => { post: workers::take },
    "/workers/untake" => { post: workers::untake },
    "/peers/sessions" => { post: listing::peer_sessions },
    "/calls/{call_id}" => { get: routes::get_call },
    "/calls/{call_id}/cancel" => { post: routes::cancel_call },
    "/units/{unit_id}/cancel" => { post: routes::cancel_unit },
    "/children/{child_id}/cancel" => { post: routes::cancel_child },
    "/children/{child_id}/heartbeat" => { post: workers::heartbeat },
    "/children/{child_id}/complete" => { post: workers::complete },
]);

/// The OpenAPI document a server with `config` serves at `GET /v1/openapi.json`.
pub fn openapi_document(config: &ServeConfig) -> serde_json::Value {
    openapi::document_for(config)
}

/// Every path the server answers and its methods: what `Allow` names, and what the OpenAPI
/// document must describe.
pub fn routes() -> Vec<(&'static str, &'static [&'static str])> {
    TOP_ROUTES.iter().chain(MCP_ROUTES).chain(V1_ROUTES).copied().collect()
}

/// Serves API.md until SIGINT or SIGTERM, then drains, closes the engine and returns.
pub async fn serve(config: ServeConfig) -> std::io::Result<()> {
    #[cfg(feature = "failpoints")]
    arm_failpoints_from_env();
    let metrics = metrics::Metrics::new();
    let queues = Arc::new(WorkQueues::new());
    let wakes = wake::Webhooks::allowing(&config.wake_allow)
        .map_err(std::io::Error::other)?
        .counted(metrics.wakes());
    let groups = sweep_command_groups(&config)?;
    let engine = engine_config(&config, wakes, &queues, groups)
        .on_flush(metrics.flush_observer())
        .on_delivery_timing(metrics.delivery_observer());
    let brood = Arc::new(Brood::open(engine).map_err(std::io::Error::other)?);
    if let Some(directory) = brood.work_directory() {
        if brood_actors::failpoints::fires("share_stall") {
            // A process slow to list its queues: the children of the sessions it recovered
            // are queued meanwhile.
            std::thread::sleep(std::time::Duration::from_millis(1500));
        }
        // Sharing the ledger: workers polling any process may be handed this one's children
        // (those queued already too).
        queues.share(directory, config.advertised());
    }
    let (stop_tx, stopping) = tokio::sync::watch::channel(false);
    let queues = web::Data::from(queues);
    let state = web::Data::new(state::State {
        brood: brood.clone(),
        config: config.clone(),
        stopping,
        openapi: Arc::new(openapi::document_for(&config)),
        probe: Default::default(),
    });
    let metrics = web::Data::new(metrics);
    let recorder = web::Data::new(mcp::Recorder::default());
    let drained = state.clone();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .app_data(metrics.clone())
            .app_data(queues.clone())
            .wrap(actix_web::middleware::from_fn(guard::guard))
            .wrap(actix_web::middleware::from_fn(metrics::count_requests))
            .configure(top_routes)
            .service(
                web::scope(mcp::PATH)
                    .app_data(recorder.clone())
                    .wrap(actix_web::middleware::from_fn(intake::bounded))
                    .wrap(actix_web::middleware::from_fn(require_key))
                    .configure(mcp_routes)
                    .default_service(web::to(routes::not_found)),
            )
            .service(
                web::scope("/v1")
                    .wrap(actix_web::middleware::from_fn(forward::forward))
                    .wrap(actix_web::middleware::from_fn(intake::bounded))
                    .wrap(actix_web::middleware::from_fn(require_key))
                    .configure(v1_routes)
                    .default_service(web::to(routes::not_found)),
            )
            .default_service(web::to(routes::not_found))
    })
    .workers(2)
    .client_request_timeout(HEAD_TIMEOUT)
    .client_disconnect_timeout(DISCONNECT_TIMEOUT)
    // A client that closes its side of the connection has hung up (HTTP/1.1 clients do not
    // half-close to wait for an answer): its request is dropped, not answered to nobody. A long
    // poll of a worker gone does not take a child for it, and one taken for it from another
    // process is given back.
    .h1_allow_half_closed(false)
    .disable_signals()
    .shutdown_timeout(IN_FLIGHT_GRACE_S)
    .bind(config.listen)?;
    tracing::info!(
        listen = %config.listen,
        api_key = config.api_key.is_some(),
        data_dir = %config.data_dir.display(),
        "brood serve listening on http://{} ({})",
        config.listen,
        if config.api_key.is_some() { "an API key is required" } else { "no API key: loopback only" }
    );
    eprintln!(
        "brood serve: listening on http://{} ({}), ledger in {}",
        config.listen,
        if config.api_key.is_some() {
            "API key required"
        } else {
            "no API key, loopback only"
        },
        match &config.ledger {
            Some(_) => "PostgreSQL".to_string(),
            None => config.data_dir.display().to_string(),
        }
    );
    let server = server.run();
    let handle = server.handle();
    let drain = Duration::from_millis(config.drain_timeout_ms);
    actix_web::rt::spawn(async move {
        let signal = stop_signal().await;
        eprintln!(
            "brood serve: {signal}: draining (running children get up to {} ms)",
            drain.as_millis()
        );
        let _ = stop_tx.send(true);
        let left = drained.brood.drain(drain).await;
        if left > 0 {
            tracing::warn!(
                running = left,
                "the drain timeout passed with children still running; the next start resolves them"
            );
        }
        handle.stop(true).await;
    });
    server.await?;
    // The workers' apps (and the stop task) let go of the engine a moment after the server
    // ends. Wait for that, bounded: an engine still shared here is never shut down, because the
    // process exits before the last holder drops it — its runners with it, never dropped, so
    // the process groups of `command` children would outlive the server.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(IN_FLIGHT_GRACE_S);
    while Arc::strong_count(&brood) > 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    match Arc::try_unwrap(brood) {
        Ok(b) => b.shutdown(),
        Err(_) => tracing::warn!("the engine was still shared after the server stopped; it closes when dropped"),
    }
    Ok(())
}

/// The live web view (`GET /ui`): one page of plain HTML and JavaScript, no build step, no CDN.
/// It holds no data of its own: it reads the API, with the key the user gives it when the
/// server has one.
const UI_PAGE: &str = include_str!("ui.html");

#[utoipa::path(
    get, path = "/ui", operation_id = "ui",
    responses((status = 200, description = "The live web view.", content_type = "text/html", body = String))
)]
async fn ui() -> actix_web::HttpResponse {
    actix_web::HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header(("Cache-Control", "no-store"))
        .body(UI_PAGE)
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_bearer_scheme_is_read_in_any_case() {
        for value in ["Bearer k1", "bearer k1", "BEARER k1", "bEaReR   k1"] {
            assert_eq!(super::bearer_token(value), Some("k1"), "{value}");
        }
        for value in ["Basic k1", "Bearerk1", "k1", ""] {
            assert_eq!(super::bearer_token(value), None, "{value}");
        }
    }

    use super::*;

    #[test]
    fn keys_compare_equal_only_when_equal() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secre"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
