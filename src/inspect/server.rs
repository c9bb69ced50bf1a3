//! An inspection of a running server, over API.md: `GET /v1/sessions` page by page (following
//! `next`), `GET /v1/sessions/{id}` for each session's calls, `GET /v1/dead-letters`, each reply read
//! as its [`brood_server::api`] type. Nothing here changes the server's state.

use std::io::Read as _;
use std::time::Duration;

use brood_server::api::{DeadLetters, ErrorReply, SessionDetail, SessionList};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::de::DeserializeOwned;

use super::{InspectError, Inspection, SessionView, Source};

/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(30);
/// The page size asked for (API.md's largest).
const PAGE: usize = 1000;
/// What stays as it is in a path segment or a query value: RFC 3986's unreserved characters.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// Which server to inspect, and with which key.
#[derive(Clone)]
pub struct ServerSource {
    base: String,
    api_key: Option<String>,
}

impl std::fmt::Debug for ServerSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key itself.
        f.debug_struct("ServerSource")
            .field("base", &self.base)
            .field("api_key", &self.api_key.as_ref().map(|_| "…"))
            .finish()
    }
}

impl ServerSource {
    /// The server at `url` (`http://host:port`; this build has no TLS client), without a key.
    pub fn new(url: impl Into<String>) -> Self {
        ServerSource {
            base: url.into().trim_end_matches('/').to_string(),
            api_key: None,
        }
    }

    /// Sends `Authorization: Bearer <key>` with every request.
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }
}

struct Client<'a> {
    source: &'a ServerSource,
    agent: ureq::Agent,
}

impl Client<'_> {
    /// A GET of `path`, its JSON answer decoded; any status but 200 is an error.
    fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, InspectError> {
        let url = format!("{}{path}", self.source.base);
        let mut request = self.agent.get(&url);
        if let Some(key) = &self.source.api_key {
            request = request.header("Authorization", format!("Bearer {key}"));
        }
        let unreachable = |e: ureq::Error| InspectError::Unreachable {
            url: url.clone(),
            source: Box::new(e),
        };
        let mut response = request.call().map_err(unreachable)?;
        let status = response.status().as_u16();
        let mut text = String::new();
        response
            .body_mut()
            .as_reader()
            .read_to_string(&mut text)
            .map_err(|e| unreachable(ureq::Error::Io(e)))?;
        if status != 200 {
            let (code, message) = match serde_json::from_str::<ErrorReply>(&text) {
                Ok(reply) => (reply.error.code, reply.error.message),
                Err(_) => (String::new(), text),
            };
            return Err(InspectError::Server {
                url,
                status,
                code,
                message,
            });
        }
        serde_json::from_str(&text).map_err(|source| InspectError::BadReply { url, source })
    }
}

fn component(text: &str) -> String {
    utf8_percent_encode(text, COMPONENT).to_string()
}

/// One session with every call the server stores (delivered ones too), read a page at a time.
fn whole_session(client: &Client<'_>, id: &str) -> Result<SessionView, InspectError> {
    let base = format!("/v1/sessions/{}?delivered=true&limit={PAGE}", component(id));
    let mut detail: SessionDetail = client.get(&base)?;
    let mut next = detail.calls_next.take();
    while let Some(after) = next {
        let mut page: SessionDetail = client.get(&format!("{base}&after={}", component(&after)))?;
        detail.calls.append(&mut page.calls);
        next = page.calls_next;
    }
    Ok(SessionView::from(detail))
}

/// Reads every session of the server (or only `session`), their calls and the dead letters.
pub fn from_server(source: &ServerSource, session: Option<&str>) -> Result<Inspection, InspectError> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(TIMEOUT))
        .http_status_as_error(false)
        .build()
        .into();
    let client = Client { source, agent };
    let ids = match session {
        Some(id) => vec![id.to_string()],
        None => {
            let mut ids = Vec::new();
            let mut after: Option<String> = None;
            loop {
                let mut path = format!("/v1/sessions?limit={PAGE}");
                if let Some(a) = &after {
                    path.push_str(&format!("&after={}", component(a)));
                }
                let page: SessionList = client.get(&path)?;
                ids.extend(page.sessions.into_iter().map(|s| s.session_id));
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
            ids
        }
    };
    let mut sessions = Vec::with_capacity(ids.len());
    for id in &ids {
        match whole_session(&client, id) {
            Ok(s) => sessions.push(s),
            Err(InspectError::Server { status: 404, .. }) if session.is_some() => {
                return Err(InspectError::UnknownSession(id.clone()))
            }
            Err(e) => return Err(e),
        }
    }
    let dead: DeadLetters = client.get("/v1/dead-letters")?;
    Inspection::assemble(Source::Server, sessions, dead.items, None, session)
}
