//! `GET /v1/openapi.json`: the OpenAPI 3.1 document of API.md as this server answers it, kept
//! by hand in `openapi.json` beside this file and compiled in. `tests/openapi.rs` holds it to
//! the truth: real replies must validate against it, and every route the server registers must
//! be in it.

use actix_web::HttpResponse;

/// The document, as served.
pub(super) const DOCUMENT: &str = include_str!("openapi.json");

pub(super) async fn document() -> HttpResponse {
    HttpResponse::Ok().content_type("application/json").body(DOCUMENT)
}
