//! How a `/v1` request's body is read: whole, before its handler runs, at most `body_limit`
//! bytes (413 `body_too_large`) and within `body_timeout_ms` of the head (408 `body_timeout`,
//! and the connection is closed). actix-web's `client_request_timeout` bounds the head only: a
//! body sent a byte at a time would otherwise hold its connection, and its handler, for as long
//! as its sender likes. Every route is covered, those whose handlers read no body too; handlers
//! then read the body from memory.
//!
//! This runs after the key check, so only an authenticated request has its body read at all.

use std::time::Duration;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{ConnectionType, StatusCode};
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage as _};
use futures::StreamExt as _;

use super::api::ApiError;
use super::routes::State;

pub(super) async fn bounded(
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
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
    let mut reply = actix_web::ResponseError::error_response(&refused);
    // What is left of the body is not read here: the connection cannot carry another request.
    // (actix-web closes it once the reply is out, except under a chunked body, whose rest it
    // reads and drops for as long as the client sends it; no handler waits on it meanwhile.)
    reply.head_mut().set_connection_type(ConnectionType::Close);
    Ok(req.into_response(reply).map_into_right_body())
}
