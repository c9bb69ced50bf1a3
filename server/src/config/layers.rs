//! Where settings come from: the three layers merged over the defaults, each a
//! [`figment::Provider`] — the TOML file (`--config`), the `BROOD_<KEY>` environment variables
//! and the flags — whose metadata names the source of each value: the file with the line and
//! column of the value, the variable, the flag. It also holds the one list of the `BROOD_`
//! variables that are not configuration ([`READ_ELSEWHERE`], [`READ_BY_TESTS`]). What a value
//! may be is not decided here (`keys` does).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use figment::value::{Dict, Map, Value};
use figment::{Metadata, Profile, Provider};

use super::keys::{is_key, key_list, nearest_key, Raw};
use super::ConfigError;

/// The prefix of the environment variables that are configuration keys.
const PREFIX: &str = "BROOD_";

/// The `BROOD_` variables brood itself reads that are not configuration keys, with who reads
/// them. With [`READ_BY_TESTS`], every `BROOD_` variable that may be in the environment of
/// `brood serve` and is not `BROOD_<KEY>`: any other is refused as a mistyped key.
pub(super) const READ_ELSEWHERE: &[(&str, &str)] = &[
    (
        "BROOD_FAILPOINTS",
        "fault points armed at start (builds with the failpoints feature)",
    ),
    ("BROOD_CHILD_ID", "given to each command child"),
    (
        "BROOD_OUTPUT",
        "given to each command child: the file for its result data",
    ),
    ("BROOD_BENCH_RSS_CHILD", "brood bench's memory-measuring child process"),
    (
        "BROOD_BENCH_SERVE",
        "brood bench: the `brood` binary whose server the HTTP groups start",
    ),
];

/// The `BROOD_` variables brood's tests read (servers the tests start inherit them).
pub(super) const READ_BY_TESTS: &[(&str, &str)] = &[
    ("BROOD_TEST_LEDGER", "the tests: which ledger their engines use"),
    ("BROOD_TEST_PG", "the tests: the PostgreSQL server they use"),
    (
        "BROOD_BIN",
        "the Python and TypeScript clients' tests: the brood binary they start",
    ),
    (
        "BROOD_TEST_PYTHON",
        "tests/python_client.rs and tests/mcp.rs: the Python they run",
    ),
    (
        "BROOD_TEST_PG_DATABASES",
        "the Python and TypeScript clients' tests: the PostgreSQL databases their several processes share",
    ),
    (
        "BROOD_URL",
        "the TypeScript client's bench: a running server to measure",
    ),
    ("BROOD_CHROMIUM", "the browser tests"),
    ("BROOD_API_MODEL_TRACE", "tests/api_model.rs"),
    ("BROOD_I1_CRASH_DIR", "tests/i1_no_loss.rs"),
    ("BROOD_CRASH_ROUNDS", "tests/crash.rs"),
    ("BROOD_CRASH_SEED", "tests/crash.rs"),
    ("BROOD_CRASH_WORKER_DIR", "tests/crash.rs"),
    ("BROOD_CRASH_WORKER_SEED", "tests/crash.rs"),
    ("BROOD_POWERLOSS_ROUNDS", "tests/powerloss.rs"),
    ("BROOD_POWERLOSS_SEED", "tests/powerloss.rs"),
    ("BROOD_POWERLOSS_WORKER_DIR", "tests/powerloss.rs"),
    ("BROOD_POWERLOSS_WORKER_LEVEL", "tests/powerloss.rs"),
    ("BROOD_POWERLOSS_WORKER_LOG", "tests/powerloss.rs"),
    ("BROOD_POWERLOSS_WORKER_SEED", "tests/powerloss.rs"),
    ("BROOD_SHARED_MODEL_CASES", "tests/shared_model.rs"),
    ("BROOD_SHARED_MODEL_FAULTS", "tests/shared_model.rs"),
    ("BROOD_SHARED_MODEL_LOG", "tests/shared_model.rs"),
    ("BROOD_SHARED_MODEL_SEED", "tests/shared_model.rs"),
    ("BROOD_SHARED_MODEL_STEPS", "tests/shared_model.rs"),
];

/// Whether `name` is a `BROOD_` variable read for something else than configuration.
pub(super) fn read_elsewhere(name: &str) -> bool {
    READ_ELSEWHERE.iter().chain(READ_BY_TESTS).any(|(n, _)| *n == name)
}

/// One layer of settings: its values by key, and the metadata naming where they came from.
pub(super) struct Layer {
    values: Dict,
    metadata: Metadata,
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        self.metadata.clone()
    }

    fn data(&self) -> figment::Result<Map<Profile, Dict>> {
        Ok(Profile::Default.collect(self.values.clone()))
    }
}

impl Layer {
    /// The settings of a TOML file. A file that cannot be read, or is not TOML, is an error
    /// naming it (and, for TOML, the line and column).
    pub(super) fn file(path: &Path) -> Result<Layer, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            key: "config".into(),
            source_name: format!("file {shown}"),
            problem: format!("cannot be read: {e}"),
            cause: Some(Box::new(e)),
        })?;
        let table: BTreeMap<String, toml::Spanned<Value>> = toml::from_str(&text).map_err(|e| ConfigError {
            key: "config".into(),
            source_name: format!("file {}", at(&shown, e.span().map(|s| Position::of(&text, s.start)))),
            problem: format!("is not valid TOML: {}", e.message().trim_end()),
            cause: Some(Box::new(e)),
        })?;
        let positions: BTreeMap<String, Position> = table
            .iter()
            .map(|(key, value)| (key.clone(), Position::of(&text, value.span().start)))
            .collect();
        let positions = Arc::new(positions);
        let metadata = Metadata::named("file")
            .source(path)
            .interpolater(move |_: &Profile, keys: &[&str]| at(&shown, positions.get(&keys.join(".")).copied()));
        let values = table.into_iter().map(|(k, v)| (k, v.into_inner())).collect();
        Ok(Layer { values, metadata })
    }

    /// The `BROOD_<KEY>` variables of `vars`, each by its key (`BROOD_MAX_DEPTH` is
    /// `max_depth`). A `BROOD_` variable that names no key and is not [`read_elsewhere`] is an
    /// error naming it: a mistyped key would be ignored otherwise.
    pub(super) fn environment(vars: impl IntoIterator<Item = (String, String)>) -> Result<Layer, ConfigError> {
        let mut ours: Vec<(String, String)> = vars
            .into_iter()
            .filter(|(name, _)| name.starts_with(PREFIX) && !read_elsewhere(name))
            .collect();
        // The environment's order is no order; the first refused variable is the same each run.
        ours.sort();
        let mut values = Dict::new();
        let mut names = BTreeMap::new();
        for (name, value) in ours {
            let key = name[PREFIX.len()..].to_ascii_lowercase();
            if !is_key(&key) {
                return Err(ConfigError {
                    source_name: format!("environment variable {name}"),
                    problem: unknown_variable(&key),
                    cause: None,
                    key,
                });
            }
            values.insert(key.clone(), Value::from(value));
            names.insert(key, name);
        }
        let names = Arc::new(names);
        let metadata = Metadata::named("environment variable").interpolater(move |_: &Profile, keys: &[&str]| {
            let key = keys.join(".");
            names
                .get(&key)
                .cloned()
                .unwrap_or_else(|| format!("{PREFIX}{}", key.to_ascii_uppercase()))
        });
        Ok(Layer { values, metadata })
    }

    /// The flags given on the command line, by key.
    pub(super) fn flags(flags: BTreeMap<String, String>) -> Layer {
        let values = flags.into_iter().map(|(k, v)| (k, Value::from(v))).collect();
        let metadata = Metadata::named("flag")
            .interpolater(|_: &Profile, keys: &[&str]| format!("--{}", keys.join(".").replace('_', "-")));
        Layer { values, metadata }
    }

    /// The layer's values, each as the key it sets reads it.
    pub(super) fn values(&self) -> impl Iterator<Item = (&str, Raw<'_>)> {
        self.values
            .iter()
            .map(|(key, value)| (key.as_str(), raw(&self.metadata, value)))
    }

    /// Where the layer's `key` came from, as [`source_name`] says it.
    pub(super) fn source_name(&self, key: &str) -> String {
        source_name(&self.metadata, key)
    }
}

/// Why a `BROOD_` variable that sets `key` is refused: it names no key, and brood reads it for
/// nothing else.
fn unknown_variable(key: &str) -> String {
    let hint = nearest_key(key).map_or(String::new(), |k| {
        format!(" (did you mean {PREFIX}{}?)", k.to_ascii_uppercase())
    });
    let elsewhere: Vec<&str> = READ_ELSEWHERE.iter().map(|(n, _)| *n).collect();
    format!(
        "names no configuration key{hint}: a {PREFIX} variable is {PREFIX}<KEY> for one of the keys ({}), or one brood reads for another purpose ({}, or one of its tests'); correct its name, or unset it",
        key_list(),
        elsewhere.join(", ")
    )
}

/// A value as its key reads it: a file's values keep their TOML type; the environment's and
/// the flags' are text.
pub(super) fn raw<'a>(metadata: &Metadata, value: &'a Value) -> Raw<'a> {
    let from_file = metadata.source.as_ref().and_then(|s| s.file_path()).is_some();
    match value {
        Value::String(_, text) if !from_file => Raw::Text(text),
        _ => Raw::Typed(value),
    }
}

/// Where `key` came from: `file <path>, line L, column C`, `environment variable BROOD_<KEY>`
/// or `flag --<key>`.
pub(super) fn source_name(metadata: &Metadata, key: &str) -> String {
    format!("{} {}", metadata.name, metadata.interpolate(&Profile::Default, &[key]))
}

/// A place in a file, 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Position {
    line: usize,
    column: usize,
}

impl Position {
    /// The line and column (in characters) of byte `offset` of `text`.
    fn of(text: &str, offset: usize) -> Position {
        let before = text.get(..offset).unwrap_or(text);
        let line_start = before.rfind('\n').map_or(0, |n| n + 1);
        Position {
            line: before.matches('\n').count() + 1,
            column: before[line_start..].chars().count() + 1,
        }
    }
}

/// A file's name, with a position in it when there is one.
fn at(file: &str, position: Option<Position>) -> String {
    match position {
        Some(Position { line, column }) => format!("{file}, line {line}, column {column}"),
        None => file.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::Position;

    #[test]
    fn a_position_counts_lines_and_characters_from_one() {
        let text = "a = 1\nbé = \"x\"\n";
        assert_eq!(Position::of(text, 0), Position { line: 1, column: 1 });
        assert_eq!(Position::of(text, 6), Position { line: 2, column: 1 });
        let quote = text.find('"').unwrap();
        assert_eq!(Position::of(text, quote), Position { line: 2, column: 6 });
    }
}
