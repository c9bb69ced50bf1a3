//! How a `/v1` request's body is read: whole, before its handler runs, at most `body_limit`
//! bytes (413 `body_too_large`) and within `body_timeout_ms` of the head (408 `body_timeout`,
//! and the connection is closed). actix-web's `client_request_timeout` bounds the head only: a
//! body sent a byte at a time would otherwise hold its connection, and its handler, for as long
//! as its sender likes. Every route is covered, those whose handlers read no body too; handlers
//! then read the body from memory.
//!
//! This runs after the key check, so only an authenticated request has its body read at all.
//!
//! A refused request's body is not read either, here or by the key check and the guard: their
//! replies hold its payload ([`Unread`]) until they are sent. actix-web closes a connection
//! after a reply whose request's body is still held unread, but goes on reading a chunked body
//! nobody holds, for as long as the client sends it.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::body::{BodySize, BoxBody, EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{ConnectionType, StatusCode};
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage as _};
use futures::StreamExt as _;

use super::api::ApiError;
use super::state::State;

pub(super) async fn bounded(
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody, Unread>>, actix_web::Error> {
    let Some(state) = req.app_data::<web::Data<State>>().cloned() else {
        return Ok(next.call(req).await?.map_into_left_body());
    };
    let (limit, timeout) = (state.config.body_limit, state.config.body_timeout_ms);
    let mut payload = req.take_payload();
    let read = async {
        let mut body = web::BytesMut::new();
        while let Some(chunk) = payload.next().await {
            let chunk = chunk.map_err(|e| ApiError::invalid(format!("the body could not be read: {e}")))?;
            if body.len() + chunk.len() > limit {
                return Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    format!("the body is over the limit of {limit} bytes"),
                ));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    };
    let refused = match tokio::time::timeout(Duration::from_millis(timeout), read).await {
        Ok(Ok(body)) => {
            req.set_payload(actix_web::dev::Payload::from(body.freeze()));
            return Ok(next.call(req).await?.map_into_left_body());
        }
        Ok(Err(e)) => e,
        Err(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!(
                "the body did not arrive whole within {timeout} ms (the server's body_timeout_ms), and the connection is closed; send the request again with its body at once"
            ),
        ),
    };
    Ok(refuse(req, payload, &refused).map_into_right_body())
}

/// A reply's body that holds its request's unread payload until the reply is sent, so that
/// the connection is closed after it (see the module docs).
pub(super) struct Unread {
    body: BoxBody,
    _payload: Option<Box<actix_web::dev::Payload>>,
}

impl MessageBody for Unread {
    type Error = <BoxBody as MessageBody>::Error;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<web::Bytes, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_next(cx)
    }
}

/// `res` with its body holding `payload` (what is left of its request's body).
pub(super) fn holding<B: MessageBody + 'static>(
    res: ServiceResponse<B>,
    payload: actix_web::dev::Payload,
) -> ServiceResponse<Unread> {
    res.map_body(|_, body| Unread {
        body: body.boxed(),
        _payload: Some(Box::new(payload)),
    })
}

/// The reply refusing `req` with `e`, holding `payload` (its body, or what is left of it): the
/// connection is closed after it, whatever is left unsent of the body.
pub(super) fn refuse(req: ServiceRequest, payload: actix_web::dev::Payload, e: &ApiError) -> ServiceResponse<Unread> {
    let mut reply = actix_web::ResponseError::error_response(e);
    reply.head_mut().set_connection_type(ConnectionType::Close);
    holding(req.into_response(reply), payload)
}

/// The reply refusing `req` with `e`, its body left unread (see [`refuse`]).
pub(super) fn refuse_unread(mut req: ServiceRequest, e: &ApiError) -> ServiceResponse<Unread> {
    let payload = req.take_payload();
    refuse(req, payload, e)
}
