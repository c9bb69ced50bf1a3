//! The durable format: the one place that turns stored rows into bytes and back.
//!
//! Every value is one version byte followed by the row encoded with bincode 2 (serde, standard
//! configuration with a size limit of [`MAX_VALUE_BYTES`]). The actors and the ledger never touch
//! bincode directly, so the format can change here alone: a new version byte, and a decoder for
//! each version still on disk.
//!
//! Each stored type ([`Stored`]) has its own version: [`FORMAT_VERSION`] for a layout unchanged
//! since the first, a later one for a type whose layout grew. A value of an earlier version is
//! read by the type's decoder for it ([`Stored::decode_older`]), so rows written before a field
//! was added still load; one of a later version than this build writes is refused.
//!
//! | type | version | layout |
//! |---|---|---|
//! | [`SessionRow`] | 2 | version 1 (`SessionRowV1`) and `addressable` |
//! | [`CallRow`] | 3 | version 2 (`CallRowV2`) with each [`Task`]'s `input` and `retry`, and `idempotency` |
//! | [`ChildRow`] | 2 | version 1 (`ChildRowV1`) and `output` after `summary` |
//! | every other row | 1 | as first written |
//!
//! Arbitrary JSON (a task's `input`, a child's `output`) is stored as its JSON text in a
//! `String`: bincode cannot carry `serde_json::Value` (it needs a self-describing format), and
//! text keeps the value exactly as it was given, numbers included.
//!
//! Decoding never trusts a length it reads: bincode's standard configuration has no limit, so one
//! damaged length prefix would make it try to allocate exabytes and abort the process. With the
//! limit, such a value is refused with [`CodecError::Decode`] and the ledger quarantines it.

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::model::*;

/// The ledger's format: the version of every stored type whose layout never changed (the meta
/// tree records it; a ledger of another format is refused at its open).
pub const FORMAT_VERSION: u8 = 1;

/// A type the ledger stores: the version its values are written with, and how a value of an
/// earlier version is read.
pub trait Stored: Serialize + DeserializeOwned {
    /// The version byte written in front of this type's values.
    const VERSION: u8 = FORMAT_VERSION;

    /// Reads the body (what follows the version byte) of a value written with `version`, an
    /// earlier one than [`Stored::VERSION`].
    fn decode_older(version: u8, body: &[u8]) -> Result<Self, CodecError> {
        let _ = body;
        Err(CodecError::UnknownVersion { found: version })
    }
}

macro_rules! stored_as_first_written {
    ($($t:ty),* $(,)?) => {
        $( impl Stored for $t {} )*
    };
}

stored_as_first_written!(
    u8,
    String,
    ClaimRow,
    AckRow,
    DeadLetterRow,
    QuarantineRow,
    WakeRow,
    NestRow,
    StartRow,
    RedriveRow,
);

/// A session row as version 1 stored it, before `addressable`.
#[derive(Debug, Deserialize)]
struct SessionRowV1 {
    session_id: String,
    max_concurrent_children: u32,
    max_delivery_attempts: u32,
    next_set: u64,
    created_at_ms: u64,
}

impl Stored for SessionRow {
    const VERSION: u8 = 2;

    fn decode_older(version: u8, body: &[u8]) -> Result<Self, CodecError> {
        match version {
            1 => {
                let v1: SessionRowV1 = decode_body(body)?;
                Ok(SessionRow {
                    session_id: v1.session_id,
                    max_concurrent_children: v1.max_concurrent_children,
                    max_delivery_attempts: v1.max_delivery_attempts,
                    next_set: v1.next_set,
                    created_at_ms: v1.created_at_ms,
                    // Version 1 kept no such setting: wake-capable only through a wake target.
                    addressable: false,
                })
            }
            found => Err(CodecError::UnknownVersion { found }),
        }
    }
}

/// A task as call rows of versions 1 and 2 stored it, before `input`.
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct TaskV1 {
    goal: String,
    runner_json: String,
    group: Option<String>,
    timeout_ms: Option<u64>,
    stall_ms: u64,
    rerun_on_recovery: bool,
}

impl From<TaskV1> for Task {
    fn from(t: TaskV1) -> Self {
        Task {
            goal: t.goal,
            runner_json: t.runner_json,
            group: t.group,
            timeout_ms: t.timeout_ms,
            stall_ms: t.stall_ms,
            rerun_on_recovery: t.rerun_on_recovery,
            // Tasks carried no data, and had no retry policy, before version 3.
            input: None,
            retry: None,
        }
    }
}

/// A call row as version 1 stored it, before `traceparent`.
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct CallRowV1 {
    call_id: String,
    session_id: String,
    set: u64,
    mode: Mode,
    forced_sync_reason: Option<String>,
    independent_completions: bool,
    tasks: Vec<TaskV1>,
    created_at_ms: u64,
}

/// A call row as version 2 stored it: version 1 and `traceparent`, its tasks without `input`.
#[derive(Debug, Deserialize)]
struct CallRowV2 {
    call_id: String,
    session_id: String,
    set: u64,
    mode: Mode,
    forced_sync_reason: Option<String>,
    independent_completions: bool,
    tasks: Vec<TaskV1>,
    created_at_ms: u64,
    traceparent: Option<String>,
}

impl Stored for CallRow {
    const VERSION: u8 = 3;

    fn decode_older(version: u8, body: &[u8]) -> Result<Self, CodecError> {
        let v2 = match version {
            1 => {
                let v1: CallRowV1 = decode_body(body)?;
                CallRowV2 {
                    call_id: v1.call_id,
                    session_id: v1.session_id,
                    set: v1.set,
                    mode: v1.mode,
                    forced_sync_reason: v1.forced_sync_reason,
                    independent_completions: v1.independent_completions,
                    tasks: v1.tasks,
                    created_at_ms: v1.created_at_ms,
                    // Version 1 kept no trace context: its children run without one.
                    traceparent: None,
                }
            }
            2 => decode_body(body)?,
            found => return Err(CodecError::UnknownVersion { found }),
        };
        Ok(CallRow {
            call_id: v2.call_id,
            session_id: v2.session_id,
            set: v2.set,
            mode: v2.mode,
            forced_sync_reason: v2.forced_sync_reason,
            independent_completions: v2.independent_completions,
            tasks: v2.tasks.into_iter().map(Task::from).collect(),
            created_at_ms: v2.created_at_ms,
            traceparent: v2.traceparent,
            // Calls were not made with idempotency keys before version 3.
            idempotency: None,
        })
    }
}

/// A child row as version 1 stored it, before `output`.
#[derive(Debug, Deserialize)]
struct ChildRowV1 {
    child_id: String,
    call_id: String,
    unit_id: String,
    session_id: String,
    task_index: u32,
    status: ChildStatus,
    summary: Option<String>,
    error: Option<String>,
    started_at_ms: Option<u64>,
    finished_at_ms: Option<u64>,
    attempt: u32,
    recovered: bool,
    result: DeliveryRow,
    notice: DeliveryRow,
}

impl Stored for ChildRow {
    const VERSION: u8 = 2;

    fn decode_older(version: u8, body: &[u8]) -> Result<Self, CodecError> {
        match version {
            1 => {
                let v1: ChildRowV1 = decode_body(body)?;
                Ok(ChildRow {
                    child_id: v1.child_id,
                    call_id: v1.call_id,
                    unit_id: v1.unit_id,
                    session_id: v1.session_id,
                    task_index: v1.task_index,
                    status: v1.status,
                    summary: v1.summary,
                    // Children recorded no data before version 2.
                    output: None,
                    error: v1.error,
                    started_at_ms: v1.started_at_ms,
                    finished_at_ms: v1.finished_at_ms,
                    attempt: v1.attempt,
                    recovered: v1.recovered,
                    result: v1.result,
                    notice: v1.notice,
                })
            }
            found => Err(CodecError::UnknownVersion { found }),
        }
    }
}

/// The bytes a build of version 1 wrote for `call` (its tasks' inputs and its trace context
/// left out), for tests of ledgers that still hold such rows.
#[cfg(test)]
pub(crate) fn call_row_v1(call: &CallRow) -> Vec<u8> {
    let v1 = CallRowV1 {
        call_id: call.call_id.clone(),
        session_id: call.session_id.clone(),
        set: call.set,
        mode: call.mode,
        forced_sync_reason: call.forced_sync_reason.clone(),
        independent_completions: call.independent_completions,
        tasks: call
            .tasks
            .iter()
            .map(|t| TaskV1 {
                goal: t.goal.clone(),
                runner_json: t.runner_json.clone(),
                group: t.group.clone(),
                timeout_ms: t.timeout_ms,
                stall_ms: t.stall_ms,
                rerun_on_recovery: t.rerun_on_recovery,
            })
            .collect(),
        created_at_ms: call.created_at_ms,
    };
    let mut out = vec![1];
    bincode::serde::encode_into_std_write(&v1, &mut out, config()).expect("a call row encodes");
    out
}

pub use crate::model::MAX_VALUE_BYTES;

type Config = bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<MAX_VALUE_BYTES>,
>;

fn config() -> Config {
    bincode::config::standard().with_limit::<MAX_VALUE_BYTES>()
}

/// A stored value could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The value is empty: not even a version byte.
    #[error("stored value is empty (no version byte)")]
    Empty,
    /// The value was written with a version of its type's layout this build does not read.
    #[error("stored value has format version {found}, which this build does not read for its type")]
    UnknownVersion {
        /// The version byte found.
        found: u8,
    },
    /// bincode refused to decode the value.
    #[error("stored value is malformed: {0}")]
    Decode(#[from] bincode::error::DecodeError),
    /// bincode refused to encode the value.
    #[error("value could not be encoded: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    /// Bytes were left after the value.
    #[error("stored value has {0} trailing bytes")]
    Trailing(usize),
    /// The value is larger than [`MAX_VALUE_BYTES`].
    #[error("value of {0} bytes is over the limit of {MAX_VALUE_BYTES} bytes")]
    TooLarge(usize),
}

/// Encodes a row: its type's version byte, then bincode.
pub fn encode<T: Stored>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::with_capacity(128);
    out.push(T::VERSION);
    bincode::serde::encode_into_std_write(value, &mut out, config())?;
    if out.len() > MAX_VALUE_BYTES {
        return Err(CodecError::TooLarge(out.len()));
    }
    Ok(out)
}

/// Decodes a row written by [`encode`], of this build's version of its type or an earlier one.
pub fn decode<T: Stored>(bytes: &[u8]) -> Result<T, CodecError> {
    if bytes.len() > MAX_VALUE_BYTES + 1 {
        return Err(CodecError::TooLarge(bytes.len()));
    }
    let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    match version {
        v if v == T::VERSION => decode_body(body),
        // Version 0 was never written.
        v if (1..T::VERSION).contains(&v) => T::decode_older(v, body),
        found => Err(CodecError::UnknownVersion { found }),
    }
}

/// Decodes one layout's bincode body, all of it.
fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, CodecError> {
    let (value, read) = bincode::serde::decode_from_slice(body, config())?;
    if read != body.len() {
        return Err(CodecError::Trailing(body.len() - read));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Parts of stored rows, and a row no longer stored, encoded alone to pin their bytes.
    stored_as_first_written!(UnitRow, ChildStatus, Mode, ItemKind);

    fn row() -> ChildRow {
        ChildRow {
            child_id: "deleg_1.0".into(),
            call_id: "deleg_1".into(),
            unit_id: "deleg_1-1".into(),
            session_id: "s".into(),
            task_index: 0,
            status: ChildStatus::Failed,
            summary: Some("half done".into()),
            output: None,
            error: Some("boom".into()),
            started_at_ms: Some(1),
            finished_at_ms: Some(2),
            attempt: 1,
            recovered: false,
            result: DeliveryRow::default(),
            notice: DeliveryRow {
                delivered: true,
                dead: false,
                failed_attempts: 3,
            },
        }
    }

    #[test]
    fn rows_round_trip_with_a_version_byte() {
        let bytes = encode(&row()).unwrap();
        assert_eq!(bytes[0], ChildRow::VERSION);
        assert_eq!(decode::<ChildRow>(&bytes).unwrap(), row());
        let with_output = ChildRow {
            output: Some(r#"{"n":1.50,"s":"\u00e9"}"#.into()),
            ..row()
        };
        let bytes = encode(&with_output).unwrap();
        assert_eq!(decode::<ChildRow>(&bytes).unwrap(), with_output);
    }

    #[test]
    fn malformed_values_are_refused_with_a_reason() {
        assert!(matches!(decode::<ChildRow>(&[]), Err(CodecError::Empty)));
        let mut bytes = encode(&row()).unwrap();
        bytes[0] = 9;
        assert!(matches!(
            decode::<ChildRow>(&bytes),
            Err(CodecError::UnknownVersion { found: 9 })
        ));
        let bytes = encode(&row()).unwrap();
        assert!(decode::<ChildRow>(&bytes[..bytes.len() / 2]).is_err());
        let mut bytes = encode(&row()).unwrap();
        bytes.push(0);
        assert!(matches!(decode::<ChildRow>(&bytes), Err(CodecError::Trailing(1))));
    }

    #[test]
    fn a_damaged_length_prefix_is_refused_not_allocated() {
        // child_id's length prefix is the first byte after the version: make it u64::MAX
        // (varint marker 253 + 8 bytes), which without a limit asks for an exabyte allocation.
        let bytes = encode(&row()).unwrap();
        let mut damaged = vec![ChildRow::VERSION, 253];
        damaged.extend_from_slice(&u64::MAX.to_le_bytes());
        damaged.extend_from_slice(&bytes[2..]);
        assert!(matches!(decode::<ChildRow>(&damaged), Err(CodecError::Decode(_))));
        // A length just over the limit is refused the same way.
        let mut damaged = vec![ChildRow::VERSION, 252];
        damaged.extend_from_slice(&((MAX_VALUE_BYTES as u32) + 1).to_le_bytes());
        damaged.extend_from_slice(&bytes[2..]);
        assert!(matches!(decode::<ChildRow>(&damaged), Err(CodecError::Decode(_))));
    }

    /// The call row whose bytes are pinned, without a trace context.
    fn call() -> CallRow {
        let task = Task {
            goal: "g".into(),
            runner_json: "{}".into(),
            group: Some("a".into()),
            timeout_ms: Some(5),
            stall_ms: 7,
            rerun_on_recovery: true,
            input: None,
            retry: None,
        };
        CallRow {
            call_id: "d".into(),
            session_id: "s".into(),
            set: 1,
            mode: Mode::Background,
            forced_sync_reason: None,
            independent_completions: true,
            tasks: vec![task],
            created_at_ms: 4,
            traceparent: None,
            idempotency: None,
        }
    }

    /// A value of an older version, `old`, damaged the ways any value may be, is refused, not
    /// guessed: cut short, with bytes after it, with a version this build never wrote.
    fn damaged_older_values_are_refused<T: Stored + std::fmt::Debug>(old: &[u8]) {
        assert!(matches!(decode::<T>(&old[..old.len() / 2]), Err(CodecError::Decode(_))));
        let mut longer = old.to_vec();
        longer.push(1);
        assert!(matches!(decode::<T>(&longer), Err(CodecError::Trailing(1))));
        for found in [0, T::VERSION + 1] {
            let mut other = old.to_vec();
            other[0] = found;
            assert!(matches!(
                decode::<T>(&other),
                Err(CodecError::UnknownVersion { found: f }) if f == found
            ));
        }
    }

    /// bincode numbers enum variants by position and has no field tags: these bytes pin the
    /// stored layout, so reordering a variant or a field fails here first.
    #[test]
    fn stored_layouts_are_pinned() {
        assert_eq!(
            encode(&row()).unwrap(),
            vec![
                2, 9, 100, 101, 108, 101, 103, 95, 49, 46, 48, 7, 100, 101, 108, 101, 103, 95, 49, 9, 100, 101, 108,
                101, 103, 95, 49, 45, 49, 1, 115, 0, 3, 1, 9, 104, 97, 108, 102, 32, 100, 111, 110, 101, 0, 1, 4, 98,
                111, 111, 109, 1, 1, 1, 2, 1, 0, 0, 0, 0, 1, 0, 3
            ]
        );
        let statuses: Vec<u8> = ChildStatus::ALL.iter().map(|s| encode(s).unwrap()[1]).collect();
        assert_eq!(statuses, vec![0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(encode(&Mode::Sync).unwrap(), vec![1, 1]);
        assert_eq!(encode(&ItemKind::FailureNotice).unwrap(), vec![1, 1]);
        let ack = AckRow {
            claim_id: "c".into(),
            session_id: "s".into(),
            items: vec!["x.0:result".into()],
            acked_at_ms: 5,
        };
        assert_eq!(
            encode(&ack).unwrap(),
            vec![1, 1, 99, 1, 115, 1, 10, 120, 46, 48, 58, 114, 101, 115, 117, 108, 116, 5]
        );
        let session = SessionRow {
            session_id: "s".into(),
            max_concurrent_children: 8,
            max_delivery_attempts: 3,
            next_set: 2,
            created_at_ms: 9,
            addressable: true,
        };
        assert_eq!(encode(&session).unwrap(), vec![2, 1, 115, 8, 3, 2, 9, 1]);
        let mut call = call();
        assert_eq!(
            encode(&call).unwrap(),
            vec![3, 1, 100, 1, 115, 1, 0, 0, 1, 1, 1, 103, 2, 123, 125, 1, 1, 97, 1, 5, 7, 1, 0, 0, 4, 0, 0]
        );
        call.traceparent = Some("t".into());
        call.tasks[0].input = Some("[]".into());
        assert_eq!(
            encode(&call).unwrap(),
            vec![
                3, 1, 100, 1, 115, 1, 0, 0, 1, 1, 1, 103, 2, 123, 125, 1, 1, 97, 1, 5, 7, 1, 1, 2, 91, 93, 0, 4, 1, 1,
                116, 0
            ]
        );
        call.tasks[0].retry = Some(RetryPolicy {
            max_attempts: 3,
            backoff_ms: 10,
            max_backoff_ms: 300,
        });
        call.idempotency = Some(Idempotency {
            key: "k".into(),
            fingerprint: 3,
        });
        assert_eq!(
            encode(&call).unwrap(),
            vec![
                3, 1, 100, 1, 115, 1, 0, 0, 1, 1, 1, 103, 2, 123, 125, 1, 1, 97, 1, 5, 7, 1, 1, 2, 91, 93, 1, 3, 10,
                251, 44, 1, 4, 1, 1, 116, 1, 1, 107, 3
            ]
        );
        let unit = UnitRow {
            unit_id: "d-1".into(),
            call_id: "d".into(),
            group: None,
            tasks: vec![0, 2],
        };
        assert_eq!(encode(&unit).unwrap(), vec![1, 3, 100, 45, 49, 1, 100, 0, 2, 0, 2]);
        let claim = ClaimRow {
            claim_id: "c".into(),
            session_id: "s".into(),
            consumer: "k".into(),
            lease_expires_at_ms: 300,
            items: 2,
        };
        assert_eq!(encode(&claim).unwrap(), vec![1, 1, 99, 1, 115, 1, 107, 251, 44, 1, 2]);
        let dead = DeadLetterRow {
            dedup_key: "d.0:result".into(),
            child_id: "d.0".into(),
            session_id: "s".into(),
            call_id: "d".into(),
            kind: ItemKind::Result,
            reason: "r".into(),
            attempts: 8,
            dead_at_ms: 1,
        };
        assert_eq!(
            encode(&dead).unwrap(),
            vec![1, 10, 100, 46, 48, 58, 114, 101, 115, 117, 108, 116, 3, 100, 46, 48, 1, 115, 1, 100, 0, 1, 114, 8, 1]
        );
        let quarantined = QuarantineRow {
            tree: "t".into(),
            key: vec![1],
            value_len: 2,
            reason: "r".into(),
            quarantined_at_ms: 6,
        };
        assert_eq!(encode(&quarantined).unwrap(), vec![1, 1, 116, 1, 1, 2, 1, 114, 6]);
    }

    /// A session row written before `addressable` was kept (version 1) still loads, as a
    /// session that is not addressable; its bytes are those version 1 wrote.
    #[test]
    fn a_session_row_of_version_1_reads_as_not_addressable() {
        let v1 = [1, 1, 115, 8, 3, 2, 9];
        assert_eq!(
            decode::<SessionRow>(&v1).unwrap(),
            SessionRow {
                session_id: "s".into(),
                max_concurrent_children: 8,
                max_delivery_attempts: 3,
                next_set: 2,
                created_at_ms: 9,
                addressable: false,
            }
        );
        damaged_older_values_are_refused::<SessionRow>(&v1);
    }

    /// A call row written before `traceparent` was kept (version 1) still loads, as a call
    /// without a trace context; its bytes are those version 1 wrote (pinned before).
    #[test]
    fn a_call_row_of_version_1_reads_without_a_traceparent() {
        let v1 = [
            1, 1, 100, 1, 115, 1, 0, 0, 1, 1, 1, 103, 2, 123, 125, 1, 1, 97, 1, 5, 7, 1, 4,
        ];
        let call = decode::<CallRow>(&v1).unwrap();
        assert_eq!(call, self::call());
        damaged_older_values_are_refused::<CallRow>(&v1);
        // Written again, it is this build's version.
        let again = encode(&call).unwrap();
        assert_eq!(again[0], CallRow::VERSION);
        assert_eq!(decode::<CallRow>(&again).unwrap(), call);
    }

    /// A call row written before tasks carried data (version 2) still loads, its tasks without
    /// `input`; its bytes are those version 2 wrote (pinned before).
    #[test]
    fn a_call_row_of_version_2_reads_with_tasks_without_input() {
        let v2 = [
            2, 1, 100, 1, 115, 1, 0, 0, 1, 1, 1, 103, 2, 123, 125, 1, 1, 97, 1, 5, 7, 1, 4, 1, 1, 116,
        ];
        let call = decode::<CallRow>(&v2).unwrap();
        assert_eq!(
            call,
            CallRow {
                traceparent: Some("t".into()),
                ..self::call()
            }
        );
        damaged_older_values_are_refused::<CallRow>(&v2);
    }

    /// A child row written before children recorded data (version 1) still loads, without
    /// `output`; its bytes are those version 1 wrote (pinned before).
    #[test]
    fn a_child_row_of_version_1_reads_without_output() {
        let v1 = [
            1, 9, 100, 101, 108, 101, 103, 95, 49, 46, 48, 7, 100, 101, 108, 101, 103, 95, 49, 9, 100, 101, 108, 101,
            103, 95, 49, 45, 49, 1, 115, 0, 3, 1, 9, 104, 97, 108, 102, 32, 100, 111, 110, 101, 1, 4, 98, 111, 111,
            109, 1, 1, 1, 2, 1, 0, 0, 0, 0, 1, 0, 3,
        ];
        assert_eq!(decode::<ChildRow>(&v1).unwrap(), row());
        damaged_older_values_are_refused::<ChildRow>(&v1);
    }

    #[test]
    fn a_session_row_round_trips_at_version_2() {
        let session = SessionRow {
            session_id: "s".into(),
            max_concurrent_children: 2,
            max_delivery_attempts: 5,
            next_set: 7,
            created_at_ms: 11,
            addressable: true,
        };
        let bytes = encode(&session).unwrap();
        assert_eq!(bytes[0], 2);
        assert_eq!(decode::<SessionRow>(&bytes).unwrap(), session);
        // Rows whose layout never changed keep the first version.
        let unit = UnitRow {
            unit_id: "d-1".into(),
            call_id: "d".into(),
            group: None,
            tasks: vec![0],
        };
        assert_eq!(encode(&unit).unwrap()[0], FORMAT_VERSION);
    }
}
