//! The user documentation cannot drift from the code: `docs/http.md` names every operation of
//! the OpenAPI document (`brood_server::openapi_document` of the default configuration) with
//! each of its statuses, parameters and schemas, every property of every schema, every value of
//! every enumeration (child statuses and event names each in their own place), and every error
//! code the server can answer with its status — that list read from the server's source, not
//! copied by hand. `docs/configuration.md` names every configuration key (from the
//! configuration's own key table) with its flag, its `BROOD_<KEY>` variable and its default,
//! every flag of `brood serve --help`, and every other `BROOD_` variable brood reads. And no page
//! of the documentation points outside the repository.
//!
//! Each failure names what is missing, all of them at once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let path = root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{} cannot be read: {e}", path.display()))
}

/// A markdown page: its lines, and its headings (outside code fences) with their level.
struct Page {
    lines: Vec<String>,
    headings: Vec<(usize, usize)>,
}

impl Page {
    fn open(name: &'static str) -> Page {
        let lines: Vec<String> = read(name).lines().map(str::to_string).collect();
        let mut headings = Vec::new();
        let mut fenced = false;
        for (i, line) in lines.iter().enumerate() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                continue;
            }
            if fenced {
                continue;
            }
            let level = line.chars().take_while(|c| *c == '#').count();
            if level > 0 && line[level..].starts_with(' ') {
                headings.push((i, level));
            }
        }
        Page { lines, headings }
    }

    fn text(&self) -> String {
        self.lines.join("\n")
    }

    /// The section under the first heading that holds `needle`: up to the next heading of the
    /// same level or above.
    fn section(&self, needle: &str) -> Option<String> {
        let at = self
            .headings
            .iter()
            .position(|(i, _)| self.lines[*i].contains(needle))?;
        let (start, level) = self.headings[at];
        let end = self.headings[at + 1..]
            .iter()
            .find(|(_, l)| *l <= level)
            .map_or(self.lines.len(), |(i, _)| *i);
        Some(self.lines[start..end].join("\n"))
    }

    /// The rows of its tables.
    fn rows(&self) -> impl Iterator<Item = &str> {
        self.lines
            .iter()
            .map(String::as_str)
            .filter(|l| l.trim_start().starts_with('|'))
    }
}

fn ticked(name: &str) -> String {
    format!("`{name}`")
}

/// Whether `text` holds `token` as a word of its own: not inside a longer name or number.
fn mentions(text: &str, token: &str) -> bool {
    let part = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    text.match_indices(token).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + token.len()..].chars().next();
        !before.is_some_and(part) && !after.is_some_and(part)
    })
}

fn report(what: &str, missing: &[String]) {
    assert!(
        missing.is_empty(),
        "{what} lacks {} item(s):\n  {}",
        missing.len(),
        missing.join("\n  ")
    );
}

fn document() -> Value {
    brood_server::openapi_document(&brood_server::config::ServeConfig::default())
}

/// The names of the component schemas `value` refers to.
fn refs(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            if let Some(name) = map
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix("#/components/schemas/"))
            {
                out.insert(name.to_string());
            }
            map.values().for_each(|v| refs(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

/// The property names of a schema: its own, and those of its `oneOf`/`anyOf`/`allOf`
/// branches (references not followed).
fn properties(schema: &Value, out: &mut BTreeSet<String>) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        out.extend(props.keys().cloned());
    }
    for combinator in ["oneOf", "anyOf", "allOf"] {
        for branch in schema.get(combinator).and_then(Value::as_array).into_iter().flatten() {
            properties(branch, out);
        }
    }
}

/// The string values a schema enumerates (`enum` and `const`), anywhere inside it.
fn enumerated(schema: &Value, out: &mut BTreeSet<String>) {
    match schema {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("enum", Value::Array(items)) => {
                        out.extend(items.iter().filter_map(Value::as_str).map(str::to_string))
                    }
                    ("const", Value::String(s)) => {
                        out.insert(s.clone());
                    }
                    _ => enumerated(value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| enumerated(v, out)),
        _ => {}
    }
}

/// Every operation has a section headed `` `METHOD /path` `` that names each of its statuses,
/// its parameters, and the schemas of its body and of its successful replies.
#[test]
fn http_md_names_every_operation_with_its_statuses_parameters_and_schemas() {
    let doc = document();
    let page = Page::open("docs/http.md");
    let mut missing = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("a path item") {
            if !matches!(method.as_str(), "get" | "put" | "post" | "delete" | "patch") {
                continue;
            }
            let heading = format!("`{} {path}`", method.to_uppercase());
            let Some(section) = page.section(&heading) else {
                missing.push(format!("operation {heading}: no heading names it"));
                continue;
            };
            for status in op["responses"].as_object().into_iter().flat_map(|r| r.keys()) {
                if !mentions(&section, status) {
                    missing.push(format!("operation {heading}: status {status}"));
                }
            }
            for param in op["parameters"].as_array().into_iter().flatten() {
                let name = param["name"].as_str().unwrap_or_default();
                if !section.contains(&ticked(name)) {
                    missing.push(format!("operation {heading}: parameter `{name}`"));
                }
            }
            let mut schemas = BTreeSet::new();
            refs(&op["requestBody"], &mut schemas);
            for (status, response) in op["responses"].as_object().into_iter().flatten() {
                if status.starts_with('2') {
                    refs(response, &mut schemas);
                }
            }
            for name in schemas {
                if !section.contains(&ticked(&name)) {
                    missing.push(format!("operation {heading}: its schema `{name}`"));
                }
            }
        }
    }
    report("docs/http.md", &missing);
}

/// Every schema with properties has a section headed with its name that names each property;
/// every enumerated value is named somewhere; the child statuses are listed under
/// `ChildStatus`, and each event name has a heading of its own.
#[test]
fn http_md_names_every_field_every_child_status_and_every_event() {
    let doc = document();
    let page = Page::open("docs/http.md");
    let text = page.text();
    let schemas = doc["components"]["schemas"].as_object().expect("schemas");
    let mut missing = Vec::new();
    for (name, schema) in schemas {
        let mut props = BTreeSet::new();
        properties(schema, &mut props);
        if !props.is_empty() {
            match page.section(&ticked(name)) {
                None => missing.push(format!("schema `{name}`: no heading names it")),
                Some(section) => {
                    for p in props {
                        if !section.contains(&ticked(&p)) {
                            missing.push(format!("schema `{name}`: property `{p}`"));
                        }
                    }
                }
            }
        }
        let mut values = BTreeSet::new();
        enumerated(schema, &mut values);
        for v in values {
            if !text.contains(&ticked(&v)) {
                missing.push(format!("schema `{name}`: value `{v}`"));
            }
        }
    }
    let mut statuses = BTreeSet::new();
    enumerated(&schemas["ChildStatus"], &mut statuses);
    assert!(
        statuses.contains("timed_out"),
        "the child statuses were not found: {statuses:?}"
    );
    match page.section("`ChildStatus`") {
        None => missing.push("the child statuses: no heading names `ChildStatus`".into()),
        Some(section) => {
            for s in &statuses {
                if !section.contains(&ticked(s)) {
                    missing.push(format!("child status `{s}` under `ChildStatus`"));
                }
            }
        }
    }
    let mut events = BTreeSet::new();
    enumerated(&schemas["EventName"], &mut events);
    assert!(
        events.contains("failure_notice"),
        "the event names were not found: {events:?}"
    );
    for e in &events {
        if page.section(&ticked(e)).is_none() {
            missing.push(format!("event `{e}`: no heading names it"));
        }
    }
    report("docs/http.md", &missing);
}

/// The HTTP status of a `StatusCode::` constant the server's source names.
fn status_number(name: &str) -> u16 {
    match name {
        "OK" => 200,
        "BAD_REQUEST" => 400,
        "UNAUTHORIZED" => 401,
        "FORBIDDEN" => 403,
        "NOT_FOUND" => 404,
        "METHOD_NOT_ALLOWED" => 405,
        "REQUEST_TIMEOUT" => 408,
        "CONFLICT" => 409,
        "PAYLOAD_TOO_LARGE" => 413,
        "UNSUPPORTED_MEDIA_TYPE" => 415,
        "UNPROCESSABLE_ENTITY" => 422,
        "TOO_MANY_REQUESTS" => 429,
        "INTERNAL_SERVER_ERROR" => 500,
        "BAD_GATEWAY" => 502,
        "SERVICE_UNAVAILABLE" => 503,
        "GATEWAY_TIMEOUT" => 504,
        other => panic!("StatusCode::{other} is not in this test's table: add it"),
    }
}

fn is_code(text: &str) -> bool {
    !text.is_empty()
        && text.starts_with(|c: char| c.is_ascii_lowercase())
        && text
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// A source file without its unit tests (a `#[cfg(test)]` module ends each file that has one).
fn without_tests(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod tests").map_or(text, |at| &text[..at])
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text of `text` from `start` to the first `end` after it.
fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let from = text
        .find(start)
        .unwrap_or_else(|| panic!("`{start}` is not in the source any more"));
    let rest = &text[from..];
    &rest[..rest.find(end).unwrap_or(rest.len())]
}

/// Every error code the server answers, with its statuses, read from the source: each
/// `StatusCode::X, "code"` (or `StatusCode::X, code: "code"`) of `server/src`, and each
/// engine error the server answers with its own code (`e.code()` in `api/mod.rs`, the codes
/// of `BroodError::code` in `actors/src/error.rs`).
fn answered_codes() -> BTreeMap<String, BTreeSet<u16>> {
    let mut out: BTreeMap<String, BTreeSet<u16>> = BTreeMap::new();
    let mut files = Vec::new();
    rust_files(&root().join("server/src"), &mut files);
    for file in files {
        let whole = std::fs::read_to_string(&file).unwrap();
        let text = without_tests(&whole);
        for (at, _) in text.match_indices("StatusCode::") {
            let rest = &text[at + "StatusCode::".len()..];
            let len = rest
                .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
                .unwrap_or(rest.len());
            let Some(after) = rest[len..].trim_start().strip_prefix(',') else {
                continue;
            };
            let after = after.trim_start();
            let after = after.strip_prefix("code:").map_or(after, str::trim_start);
            let Some(literal) = after.strip_prefix('"') else {
                continue;
            };
            let code = &literal[..literal.find('"').unwrap_or(0)];
            if is_code(code) {
                out.entry(code.to_string())
                    .or_default()
                    .insert(status_number(&rest[..len]));
            }
        }
    }
    // The engine's codes, by variant.
    let error = read("actors/src/error.rs");
    let mut by_variant: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in between(&error, "pub fn code(&self)", "\n    }\n").lines() {
        let (Some(v), Some((_, code))) = (line.split("BroodError::").nth(1), line.split_once("=> \"")) else {
            continue;
        };
        let variant: String = v.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
        let code = &code[..code.find('"').unwrap_or(0)];
        by_variant.entry(variant).or_default().push(code.to_string());
    }
    assert!(by_variant.len() > 10, "BroodError::code was not read: {by_variant:?}");
    // The arms of the server's conversion that answer the engine's own code.
    let api = read("server/src/api/mod.rs");
    let conversion = between(&api, "impl From<BroodError> for ApiError", "\n}\n");
    let mut arms: Vec<String> = Vec::new();
    for line in conversion.lines() {
        if line.trim_start().starts_with("BroodError::") || arms.is_empty() {
            arms.push(String::new());
        }
        let arm = arms.last_mut().unwrap();
        arm.push_str(line);
        arm.push('\n');
    }
    for arm in arms.iter().filter(|a| a.contains("e.code()")) {
        let pattern = arm.split("=>").next().unwrap_or_default();
        let status = arm
            .split("StatusCode::")
            .nth(1)
            .map(|s| {
                s.chars()
                    .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                    .collect::<String>()
            })
            .unwrap_or_else(|| panic!("an arm answering e.code() names no status: {arm}"));
        for v in pattern.split("BroodError::").skip(1) {
            let variant: String = v.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
            for code in by_variant.get(&variant).into_iter().flatten() {
                out.entry(code.clone()).or_default().insert(status_number(&status));
            }
        }
    }
    for sure in [
        "invalid_request",
        "unknown_session",
        "unknown_call",
        "lease_lapsed",
        "stale_token",
    ] {
        assert!(
            out.contains_key(sure),
            "the scan of the source missed `{sure}`: {out:?}"
        );
    }
    out
}

/// Every error code the server can answer is in a table row of docs/http.md with each status
/// it is answered with.
#[test]
fn http_md_lists_every_error_code_with_its_status() {
    let page = Page::open("docs/http.md");
    let mut missing = Vec::new();
    for (code, statuses) in answered_codes() {
        let rows: Vec<&str> = page.rows().filter(|r| r.contains(&ticked(&code))).collect();
        if rows.is_empty() {
            missing.push(format!(
                "error code `{code}` (answered with {statuses:?}): no table row names it"
            ));
            continue;
        }
        for status in statuses {
            if !rows.iter().any(|r| mentions(r, &status.to_string())) {
                missing.push(format!("error code `{code}`: its status {status}"));
            }
        }
    }
    report("docs/http.md", &missing);
}

/// The configuration keys, as the configuration's key table lists them (in the message that
/// refuses a key it does not know).
fn config_keys() -> Vec<String> {
    let flags = BTreeMap::from([("no_such_key_for_the_docs".to_string(), "1".to_string())]);
    let refused = brood_server::config::resolve(None, Vec::<(String, String)>::new(), flags)
        .expect_err("an unknown key is refused");
    let list = refused
        .problem
        .split("the keys are: ")
        .nth(1)
        .unwrap_or_else(|| panic!("the refusal no longer lists the keys: {}", refused.problem));
    let keys: Vec<String> = list.split(", ").map(|k| k.trim().to_string()).collect();
    assert!(keys.len() > 30 && keys.contains(&"listen".to_string()), "{keys:?}");
    keys
}

/// The flags of `brood serve --help`.
fn serve_flags() -> BTreeSet<String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_brood"))
        .args(["serve", "--help"])
        .output()
        .expect("brood serve --help runs");
    let help = String::from_utf8_lossy(&out.stdout);
    let mut flags = BTreeSet::new();
    for line in help.lines().filter(|l| l.trim_start().starts_with('-')) {
        for word in line.split_whitespace() {
            let word = word.trim_end_matches(',');
            if word.starts_with("--") && word != "--help" {
                flags.insert(word.to_string());
            }
        }
    }
    assert!(flags.contains("--listen"), "{help}");
    flags
}

/// The first cell of a table row, trimmed.
fn first_cell(row: &str) -> &str {
    row.trim_start()
        .trim_start_matches('|')
        .split('|')
        .next()
        .unwrap_or("")
        .trim()
}

/// A default as the configuration prints it, in the words a row should hold.
fn default_words(value: &Value) -> Vec<String> {
    match value {
        Value::String(s) => vec![s.clone()],
        Value::Number(n) => vec![n.to_string()],
        Value::Bool(b) => vec![b.to_string()],
        Value::Array(items) => items.iter().flat_map(default_words).collect(),
        _ => Vec::new(),
    }
}

/// Every key has a row in docs/configuration.md (its first cell the key) naming its flag (when `brood serve` has one),
/// its variable and its default; every flag and every `BROOD_` variable is named there.
#[test]
fn configuration_md_names_every_key_flag_and_variable() {
    let page = Page::open("docs/configuration.md");
    let text = page.text();
    let flags = serve_flags();
    let defaults = serde_json::to_value(brood_server::config::ServeConfig::default()).unwrap();
    let mut missing = Vec::new();
    for key in config_keys() {
        let Some(row) = page.rows().find(|r| first_cell(r) == ticked(&key)) else {
            missing.push(format!("key `{key}`: no table row names it"));
            continue;
        };
        let flag = format!("--{}", key.replace('_', "-"));
        if flags.contains(&flag) && !mentions(row, &flag) {
            missing.push(format!("key `{key}`: its flag {flag} in its row"));
        }
        let variable = format!("BROOD_{}", key.to_ascii_uppercase());
        if !mentions(row, &variable) {
            missing.push(format!("key `{key}`: its variable {variable} in its row"));
        }
        // One thread per core: the default depends on the machine.
        if key != "routing_threads" {
            for word in default_words(&defaults[&key]) {
                if !mentions(row, &word) {
                    missing.push(format!("key `{key}`: its default {word} in its row"));
                }
            }
        }
    }
    for flag in &flags {
        if !mentions(&text, flag) {
            missing.push(format!("flag {flag} of brood serve"));
        }
    }
    // The variables that are no key, as the configuration lists them.
    let layers = read("server/src/config/layers.rs");
    let others: BTreeSet<&str> = layers
        .split('"')
        .filter(|s| s.starts_with("BROOD_") && s.len() > "BROOD_".len())
        .collect();
    assert!(others.contains("BROOD_CHILD_ID"), "{others:?}");
    for variable in others {
        if !mentions(&text, variable) {
            missing.push(format!("variable {variable}"));
        }
    }
    report("docs/configuration.md", &missing);
}

/// The README and the docs stand on their own: no link or path leads outside the repository.
#[test]
fn the_documentation_points_nowhere_outside_the_repository() {
    let mut pages = vec![root().join("README.md")];
    for entry in std::fs::read_dir(root().join("docs")).expect("docs/") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    let mut found = Vec::new();
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        for outside in ["../shared", "/work/", "DESIGN.md", "API.md"] {
            if text.contains(outside) {
                found.push(format!("{}: {outside}", page.display()));
            }
        }
    }
    report("the documentation", &found);
}
