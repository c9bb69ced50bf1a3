//! What a request must be before anything reads it: the defence of a server on loopback
//! against the web pages its user's browser opens, which are on loopback too. It owns three
//! refusals, checked in this order around the whole app (before the key check, so a refused
//! request learns nothing, not even whether a key is needed); it does not own the key check
//! itself, nor any per-route validation.
//!
//! - **Host** (403 `forbidden_host`): the `Host` header must name this server — a loopback name
//!   (`localhost`, `*.localhost`, `127.0.0.0/8`, `[::1]`), the host it listens on, the host of
//!   `advertise`, or one of `allowed_hosts` (any port). A page whose name was re-pointed at
//!   127.0.0.1 (DNS rebinding) sends its own name, and is refused. The check applies to a server
//!   without a key, whose only protection is being on loopback, and to any server with
//!   `allowed_hosts` set; a server with a key and no `allowed_hosts` may be reached by any name
//!   (on 0.0.0.0, by its IP), as the key is what a page cannot send. 403 rather than 421
//!   Misdirected Request: browsers retry a 421 on a new connection, and a client should treat
//!   this as final, like the server's other refusals.
//! - **Cross-site browser requests** (403 `cross_origin`): an `Origin` header other than the
//!   server's own (`http://` or `https://` and the request's `Host`), or `Sec-Fetch-Site` other
//!   than `same-origin` or `none` (a page on localhost:3000 is `same-site` with localhost:7070:
//!   refused too). Clients that are not browsers send neither header. The one exception is a
//!   `GET` of `/ui`, a static page holding no data, so a link to it from elsewhere opens it.
//!   This applies with and without a key.
//! - **Body type** (415 `unsupported_media_type`): a request with a body must say
//!   `Content-Type: application/json` (parameters such as `charset=utf-8` allowed). A page can
//!   send a `text/plain` body without asking the server first; it cannot send a JSON one.
//!   A request without a body (no `Content-Length`, or 0, and no `Transfer-Encoding`) needs none.

use std::net::IpAddr;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{header, Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::web;
use actix_web::HttpMessage as _;

use super::api::ApiError;
use super::config::ServeConfig;
use super::state::State;

pub(super) async fn guard(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody, super::intake::Unread>>, actix_web::Error> {
    let refusal = req
        .app_data::<web::Data<State>>()
        .and_then(|state| refuse(&state.config, &req));
    if let Some(e) = refusal {
        return Ok(super::intake::refuse_unread(req, &e).map_into_right_body());
    }
    let reads_body = req.path().starts_with("/v1/") || req.path() == super::mcp::PATH;
    if !reads_body && has_body(&req) {
        // No route outside /v1 and /mcp reads a body: what is left of it is held, not read,
        // until the reply is out (see `intake`).
        let mut req = req;
        let payload = req.take_payload();
        let res = next.call(req).await?;
        return Ok(super::intake::holding(res, payload).map_into_right_body());
    }
    Ok(next.call(req).await?.map_into_left_body())
}

/// Whether `req` says a body follows: chunked, or a length above 0.
fn has_body(req: &ServiceRequest) -> bool {
    let headers = req.headers();
    headers.contains_key(actix_web::http::header::TRANSFER_ENCODING)
        || headers
            .get(actix_web::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|n| n.trim() != "0")
}

/// Why `req` is refused, or `None` when it may go on.
fn refuse(config: &ServeConfig, req: &ServiceRequest) -> Option<ApiError> {
    let headers = req.headers();
    let text = |name: header::HeaderName| headers.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"));
    let host = text(header::HOST);
    if checks_host(config) {
        if let Some(problem) = host_problem(config, host) {
            return Some(ApiError::new(StatusCode::FORBIDDEN, "forbidden_host", problem));
        }
    }
    let exempt = req.method() == Method::GET && req.path() == "/ui";
    if !exempt {
        let site = text(header::HeaderName::from_static("sec-fetch-site"));
        if let Some(problem) = cross_origin(text(header::ORIGIN), site, host) {
            return Some(ApiError::new(StatusCode::FORBIDDEN, "cross_origin", problem));
        }
    }
    let has_body = headers.contains_key(header::TRANSFER_ENCODING)
        || text(header::CONTENT_LENGTH).is_some_and(|n| n.trim() != "0");
    if has_body {
        if let Some(problem) = body_type_problem(text(header::CONTENT_TYPE)) {
            return Some(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                problem,
            ));
        }
    }
    None
}

/// Whether the `Host` of a request is checked: without a key, or with `allowed_hosts` set.
pub(super) fn checks_host(config: &ServeConfig) -> bool {
    config.api_key.is_none() || !config.allowed_hosts.is_empty()
}

/// Why the `Host` header `given` does not name this server, or `None` when it does.
fn host_problem(config: &ServeConfig, given: Option<&str>) -> Option<String> {
    let Some(given) = given else {
        return Some("the request has no Host header; send the name of this server (such as localhost)".into());
    };
    let name = host_name(given);
    if is_loopback_name(&name) {
        return None;
    }
    let listen = config.listen.ip();
    if !listen.is_unspecified() && name.parse::<IpAddr>().is_ok_and(|ip| ip == listen) {
        return None;
    }
    if config
        .advertise
        .as_deref()
        .is_some_and(|a| host_name(authority_of(a)) == name)
    {
        return None;
    }
    if config.allowed_hosts.contains(&name) {
        return None;
    }
    Some(format!(
        "Host {:?} does not name this server: it answers to loopback names (localhost, 127.0.0.1, [::1]){}{}; a page whose name was pointed at this address is refused. Behind a proxy, list the name the proxy is reached by in allowed_hosts (--allowed-hosts, BROOD_ALLOWED_HOSTS)",
        given,
        if listen.is_unspecified() || listen.is_loopback() {
            String::new()
        } else {
            format!(", {listen}")
        },
        if config.allowed_hosts.is_empty() {
            String::new()
        } else {
            format!(" and {}", config.allowed_hosts.join(", "))
        },
    ))
}

/// Why a request from a browser comes from another site, or `None` when it does not.
fn cross_origin(origin: Option<&str>, site: Option<&str>, host: Option<&str>) -> Option<String> {
    if let Some(site) = site {
        if !matches!(site.to_ascii_lowercase().as_str(), "same-origin" | "none") {
            return Some(format!(
                "the browser says this request comes from another site (Sec-Fetch-Site: {site:?}); brood answers pages it serves itself (/ui) only"
            ));
        }
    }
    let origin = origin?;
    let own = host.is_some_and(|host| {
        let (scheme, authority) = match origin.split_once("://") {
            Some((scheme, rest)) => (scheme.to_ascii_lowercase(), rest),
            None => return false,
        };
        let default_port = match scheme.as_str() {
            "http" => ":80",
            "https" => ":443",
            _ => return false,
        };
        let norm = |a: &str| {
            let a = a.to_ascii_lowercase();
            match a.strip_suffix(default_port) {
                Some(bare) => bare.to_string(),
                None => a,
            }
        };
        norm(authority) == norm(host)
    });
    if own {
        return None;
    }
    Some(format!(
        "the request comes from a page of another origin (Origin: {origin:?}, this server: {}); brood answers pages it serves itself (/ui) only",
        host.map_or("no Host".into(), |h| format!("{:?}", format!("http://{h}"))),
    ))
}

/// Why a body of Content-Type `given` is refused, or `None` when it is JSON.
fn body_type_problem(given: Option<&str>) -> Option<String> {
    let essence = given.map(|t| t.split(';').next().unwrap_or("").trim());
    if essence.is_some_and(|e| e.eq_ignore_ascii_case("application/json")) {
        return None;
    }
    Some(match given {
        Some(t) => format!("the body is sent as {t:?}; a request with a body must say Content-Type: application/json"),
        None => {
            "the request has a body but no Content-Type; a request with a body must say Content-Type: application/json"
                .into()
        }
    })
}

/// The authority (`host[:port]`) of an `http://…` address.
fn authority_of(address: &str) -> &str {
    let rest = address.split_once("://").map_or(address, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    authority.rsplit_once('@').map_or(authority, |(_, a)| a)
}

/// The host of a `Host` header or an authority, without its port, in lower case, without a
/// trailing dot or the brackets of an IPv6 address.
pub(super) fn host_name(authority: &str) -> String {
    let a = authority.trim();
    let host = if let Some(rest) = a.strip_prefix('[') {
        rest.split_once(']').map_or(rest, |(h, _)| h)
    } else if a.matches(':').count() > 1 {
        a
    } else {
        match a.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => a,
        }
    };
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

/// `localhost`, a name under `.localhost`, or a loopback address (127.0.0.0/8, ::1).
fn is_loopback_name(name: &str) -> bool {
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    match name.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => ip.is_loopback(),
        Ok(IpAddr::V6(ip)) => ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(f: impl FnOnce(&mut ServeConfig)) -> ServeConfig {
        let mut c = ServeConfig::default();
        f(&mut c);
        c
    }

    #[test]
    fn loopback_names_with_any_port_are_this_server() {
        let c = ServeConfig::default();
        for host in [
            "localhost",
            "LOCALHOST:7070",
            "localhost.:7070",
            "app.localhost:3000",
            "127.0.0.1:7070",
            "127.8.9.10",
            "[::1]:7070",
            "[::1]",
            "[::ffff:127.0.0.1]:80",
        ] {
            assert_eq!(host_problem(&c, Some(host)), None, "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:7070",
            "localhost.evil.example",
            "128.0.0.1:7070",
            "[::2]:7070",
            "",
        ] {
            let problem = host_problem(&c, Some(host)).expect(host);
            assert!(problem.contains("allowed_hosts"), "{problem}");
        }
        assert!(host_problem(&c, None).unwrap().contains("no Host"));
    }

    #[test]
    fn the_listen_advertised_and_allowed_hosts_are_this_server_too() {
        let c = config(|c| {
            c.listen = "10.0.0.5:7070".parse().unwrap();
            c.api_key = Some("k".into());
            c.advertise = Some("http://brood-1.internal:7070".into());
            c.allowed_hosts = vec!["brood.example".into()];
        });
        for host in [
            "10.0.0.5:7070",
            "brood-1.internal:7070",
            "Brood.Example",
            "brood.example:443",
        ] {
            assert_eq!(host_problem(&c, Some(host)), None, "{host}");
        }
        assert!(host_problem(&c, Some("10.0.0.6:7070")).is_some());
        let any = config(|c| c.listen = "0.0.0.0:7070".parse().unwrap());
        assert!(
            host_problem(&any, Some("0.0.0.0:7070")).is_some(),
            "0.0.0.0 names no host"
        );
    }

    #[test]
    fn the_host_is_checked_without_a_key_or_with_allowed_hosts() {
        assert!(checks_host(&ServeConfig::default()));
        assert!(!checks_host(&config(|c| c.api_key = Some("k".into()))));
        assert!(checks_host(&config(|c| {
            c.api_key = Some("k".into());
            c.allowed_hosts = vec!["brood.example".into()];
        })));
    }

    #[test]
    fn only_the_servers_own_origin_and_same_origin_fetches_pass() {
        let host = Some("localhost:7070");
        assert_eq!(cross_origin(None, None, host), None, "not a browser");
        assert_eq!(cross_origin(None, Some("same-origin"), host), None);
        assert_eq!(cross_origin(None, Some("none"), host), None, "typed in the address bar");
        assert_eq!(
            cross_origin(Some("http://localhost:7070"), Some("same-origin"), host),
            None
        );
        assert_eq!(
            cross_origin(Some("https://brood.example"), None, Some("brood.example")),
            None
        );
        assert_eq!(
            cross_origin(Some("http://brood.example"), None, Some("brood.example:80")),
            None
        );
        for (origin, site) in [
            (None, Some("cross-site")),
            (None, Some("same-site")),
            (Some("http://localhost:3000"), None),
            (Some("http://evil.example"), None),
            (Some("null"), None),
            (Some("ftp://localhost:7070"), None),
        ] {
            assert!(cross_origin(origin, site, host).is_some(), "{origin:?} {site:?}");
        }
        assert!(cross_origin(Some("http://localhost:7070"), None, None).is_some());
    }

    #[test]
    fn a_body_must_be_declared_json() {
        assert_eq!(body_type_problem(Some("application/json")), None);
        assert_eq!(body_type_problem(Some("Application/JSON; charset=utf-8")), None);
        for t in [
            "text/plain",
            "application/jsonp",
            "application/x-www-form-urlencoded",
            "",
        ] {
            assert!(body_type_problem(Some(t)).unwrap().contains(t), "{t}");
        }
        assert!(body_type_problem(None).unwrap().contains("no Content-Type"));
    }

    #[test]
    fn host_names_lose_their_port_brackets_and_case() {
        assert_eq!(host_name("Example.COM:8080"), "example.com");
        assert_eq!(host_name("[::1]:7070"), "::1");
        assert_eq!(host_name("::1"), "::1", "a bare IPv6 address keeps its colons");
        assert_eq!(authority_of("http://user@h.example:7070/x?y"), "h.example:7070");
    }
}
