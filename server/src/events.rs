//! `GET /v1/sessions/{session_id}/events`: a session's events as server-sent events.
//!
//! Each event is `id: <seq>`, `event: <name>` (`child`, `ready`, `wake`, `failure_notice`,
//! `claim`, `cancel`) and one line of JSON `data` with `session_id`, `seq`, `at` and the event's
//! fields, their types `api::events` (a `child` event's `traceparent` only when its call was
//! delegated with one).
//! The stream opens with a `ready` event (seq 0) giving the count ready at that moment, so a
//! client has a starting point without a second request; after that only changes come, each
//! told once it was applied. Every 15 s without an event a comment line (`: keep-alive`) keeps
//! proxies from closing the connection.
//!
//! A slow client is dropped, not buffered for: the engine keeps at most
//! [`brood::EVENTS_CAPACITY`] unread events per subscriber, and a subscriber that falls further
//! behind gets one last `dropped` event (`{"reason": "lagged", "missed": n}`) and the stream
//! ends; the client reconnects and reads the session's state. The stream also ends when the
//! server stops.

use std::sync::Arc;
use std::time::Duration;

use actix_web::web::Bytes;
use actix_web::{web, HttpResponse};
use futures::Stream;
use tokio::sync::broadcast::{error::RecvError, Receiver};

use super::api::{self, ApiError};
use super::state::State;
use brood::SessionEvent;

/// How long a quiet stream waits before it sends a keep-alive comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// One event in SSE framing. JSON from serde_json has no raw newlines, so one `data:` line.
fn frame(id: Option<u64>, name: &str, data: &str) -> Bytes {
    let mut out = String::new();
    if let Some(id) = id {
        out.push_str(&format!("id: {id}\n"));
    }
    out.push_str(&format!("event: {name}\ndata: {data}\n\n"));
    Bytes::from(out)
}

enum Next {
    Open(Receiver<Arc<SessionEvent>>),
    Done,
}

/// The SSE body: `first`, then the receiver's events, keep-alives while it is quiet, and a
/// last `dropped` event if the client fell too far behind.
fn sse(
    first: Bytes,
    rx: Receiver<Arc<SessionEvent>>,
    stopping: tokio::sync::watch::Receiver<bool>,
    keep_alive: Duration,
) -> impl Stream<Item = Result<Bytes, actix_web::Error>> {
    let head = futures::stream::once(async move { Ok(first) });
    let rest = futures::stream::unfold(Next::Open(rx), move |state| {
        let mut stopping = stopping.clone();
        async move {
            let Next::Open(mut rx) = state else {
                return None;
            };
            if *stopping.borrow_and_update() {
                return None;
            }
            let chunk = tokio::select! {
                _ = stopping.changed() => return None,
                got = rx.recv() => match got {
                    Ok(ev) => frame(Some(ev.seq), ev.event.name(), &api::events::data(&ev)),
                    Err(RecvError::Lagged(missed)) => {
                        tracing::info!(missed, "an event stream fell behind and was dropped");
                        let dropped = api::events::DroppedEvent {
                            reason: "lagged".to_string(),
                            missed,
                        };
                        let last = frame(None, "dropped", &serde_json::to_string(&dropped).unwrap_or_default());
                        return Some((Ok(last), Next::Done));
                    }
                    Err(RecvError::Closed) => return None,
                },
                _ = tokio::time::sleep(keep_alive) => Bytes::from_static(b": keep-alive\n\n"),
            };
            Some((Ok(chunk), Next::Open(rx)))
        }
    });
    futures::StreamExt::chain(head, rest)
}

#[utoipa::path(
    get, path = "/v1/sessions/{session_id}/events", operation_id = "events",
    params(("session_id" = String, Path, description = "The session: 1 to 256 characters, none a control character.", pattern = r"^[^\u0000-\u001f\u007f-\u009f]{1,256}$")),
    responses((status = 200, description = "The session's events, as server-sent events, opening with the count ready now.", content_type = "text/event-stream", body = api::events::SseEvent),
        (status = 404, description = "No such session (`unknown_session`).", body = api::ErrorReply))
)]
pub(super) async fn stream(
    state: web::Data<State>,
    access: super::scope::Access,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let session_id = super::routes::session_path(path)?;
    access.session(&state.brood, &session_id).await?;
    // Subscribed before the count is read: a change in between is told, never missed.
    let rx = state.brood.subscribe(&session_id).await?;
    let counts = state.brood.counts(&session_id).await?;
    let first = api::events::EventData {
        session_id: session_id.clone(),
        seq: 0,
        at: brood_actors::model::now_ms(),
        body: api::events::ReadyEvent {
            ready: counts.ready as u64,
        },
    };
    let first = frame(Some(0), "ready", &serde_json::to_string(&first).unwrap_or_default());
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(sse(first, rx, state.stopping.clone(), KEEP_ALIVE)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use brood::Event;
    use futures::StreamExt as _;
    use serde_json::{json, Value};
    use tokio::sync::broadcast;

    fn event(seq: u64, event: Event) -> Arc<SessionEvent> {
        Arc::new(SessionEvent {
            session_id: "s".into(),
            seq,
            at_ms: 7,
            event,
        })
    }

    fn text(chunk: Option<Result<Bytes, actix_web::Error>>) -> String {
        String::from_utf8(chunk.expect("a chunk").expect("no error").to_vec()).unwrap()
    }

    #[tokio::test]
    async fn events_are_framed_and_a_lagging_client_is_dropped() {
        let (tx, rx) = broadcast::channel(2);
        let (_stop, stopping) = tokio::sync::watch::channel(false);
        let mut body = Box::pin(sse(
            Bytes::from_static(b"first\n\n"),
            rx,
            stopping,
            Duration::from_secs(3600),
        ));
        assert_eq!(text(body.next().await), "first\n\n");
        tx.send(event(1, Event::Ready { ready: 2 })).unwrap();
        let one = text(body.next().await);
        assert!(one.starts_with("id: 1\nevent: ready\ndata: {"), "{one}");
        let data: Value = serde_json::from_str(one.lines().nth(2).unwrap().strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(data, json!({"ready": 2, "session_id": "s", "seq": 1, "at": 7}));
        // Four events into a channel of two: the reader missed two and is dropped.
        for seq in 2..6 {
            tx.send(event(seq, Event::Wake { ready: 1 })).unwrap();
        }
        let last = text(body.next().await);
        assert!(last.starts_with("event: dropped\n"), "{last}");
        assert!(last.contains(r#""missed":2"#), "{last}");
        assert!(
            body.next().await.is_none(),
            "the stream ends after it dropped the client"
        );
    }

    /// A `child` event says the call's `traceparent` when the call has one, and has no such
    /// key when it has none.
    #[test]
    fn a_child_event_carries_its_calls_traceparent() {
        let child = |traceparent: Option<&str>| -> Value {
            let text = api::events::data(&event(
                3,
                Event::Child {
                    child_id: "d.0".into(),
                    call_id: "d".into(),
                    task_index: 0,
                    status: brood::ChildStatus::Running,
                    attempts: 1,
                    output: None,
                    traceparent: traceparent.map(str::to_string),
                },
            ));
            serde_json::from_str(&text).unwrap()
        };
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            child(Some(tp)),
            json!({"child_id": "d.0", "call_id": "d", "task_index": 0, "status": "running",
                   "attempts": 1, "output": null, "traceparent": tp, "session_id": "s", "seq": 3, "at": 7})
        );
        assert!(child(None).get("traceparent").is_none(), "{}", child(None));
    }

    #[tokio::test]
    async fn a_quiet_stream_keeps_alive_and_ends_with_the_engine() {
        let (tx, rx) = broadcast::channel(4);
        let (_stop, stopping) = tokio::sync::watch::channel(false);
        let mut body = Box::pin(sse(Bytes::new(), rx, stopping, Duration::from_millis(1)));
        let _ = body.next().await;
        assert_eq!(text(body.next().await), ": keep-alive\n\n");
        drop(tx);
        assert!(body.next().await.is_none());
    }

    #[tokio::test]
    async fn a_stream_ends_when_the_server_drains() {
        let (_tx, rx) = broadcast::channel::<Arc<SessionEvent>>(4);
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let mut body = Box::pin(sse(Bytes::new(), rx, stopping, Duration::from_secs(3600)));
        let _ = body.next().await;
        stop.send(true).unwrap();
        assert!(body.next().await.is_none());
    }
}
