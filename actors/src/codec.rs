//! The durable format: the one place that turns stored rows into bytes and back.
//!
//! Every value is one version byte followed by the row encoded with bincode 2 (serde, standard
//! configuration). The actors and the ledger never touch bincode directly, so the format can
//! change here alone: a new version byte, and a decoder for each version still on disk.

use serde::{de::DeserializeOwned, Serialize};

/// The version byte written in front of every value today.
pub const FORMAT_VERSION: u8 = 1;

/// A stored value could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The value is empty: not even a version byte.
    #[error("stored value is empty (no version byte)")]
    Empty,
    /// The value was written by a format this build does not read.
    #[error("stored value has format version {found}, this build reads version {FORMAT_VERSION}")]
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
}

/// Encodes a row: version byte, then bincode.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::with_capacity(128);
    out.push(FORMAT_VERSION);
    bincode::serde::encode_into_std_write(value, &mut out, bincode::config::standard())?;
    Ok(out)
}

/// Decodes a row written by [`encode`].
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if version != FORMAT_VERSION {
        return Err(CodecError::UnknownVersion { found: version });
    }
    let (value, read) = bincode::serde::decode_from_slice(body, bincode::config::standard())?;
    if read != body.len() {
        return Err(CodecError::Trailing(body.len() - read));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::*;

    fn row() -> ChildRow {
        ChildRow {
            child_id: "deleg_1.0".into(),
            call_id: "deleg_1".into(),
            unit_id: "deleg_1-1".into(),
            session_id: "s".into(),
            task_index: 0,
            status: ChildStatus::Failed,
            summary: Some("half done".into()),
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
        assert_eq!(bytes[0], FORMAT_VERSION);
        assert_eq!(decode::<ChildRow>(&bytes).unwrap(), row());
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
}
