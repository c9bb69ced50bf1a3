//! Whole numbers in JSON: an integer, or a number written with a zero fraction (`20416.0`),
//! which JSON Schema counts as an integer too. Every number of brood's requests and runner
//! specs is read by [`whole`] (or [`whole_opt`]), so a client whose JSON library writes
//! integers as floats is understood; a fraction, a negative number, a string or a number too
//! large for its field is refused, and the message says what was given.

use serde::{Deserialize, Deserializer};

/// Reads a whole number: an integer, or a number with no fraction (`20416.0`), that fits `T`.
pub fn whole<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    let n = d.deserialize_any(WholeVisitor)?;
    T::try_from(n)
        .map_err(|_| serde::de::Error::invalid_value(serde::de::Unexpected::Unsigned(n), &"a smaller whole number"))
}

/// [`whole`], for a field that may be absent or `null`.
pub fn whole_opt<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    #[derive(Deserialize)]
    struct Wrapped<T: TryFrom<u64>>(#[serde(deserialize_with = "whole")] T);
    Ok(Option::<Wrapped<T>>::deserialize(d)?.map(|Wrapped(n)| n))
}

struct WholeVisitor;

impl serde::de::Visitor<'_> for WholeVisitor {
    type Value = u64;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a whole number, at least 0")
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<u64, E> {
        Ok(n)
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<u64, E> {
        u64::try_from(n).map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(n), &self))
    }

    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<u64, E> {
        // 2^64 is the first f64 past u64::MAX.
        if n.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&n) {
            Ok(n as u64)
        } else {
            Err(E::invalid_value(serde::de::Unexpected::Float(n), &self))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Body {
        #[serde(deserialize_with = "whole")]
        n: u32,
        #[serde(default, deserialize_with = "whole_opt")]
        m: Option<u64>,
    }

    fn read(json: &str) -> Result<Body, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn a_whole_number_is_read_also_when_written_with_a_zero_fraction() {
        let b = read(r#"{"n": 20416.0, "m": 7}"#).unwrap();
        assert_eq!((b.n, b.m), (20416, Some(7)));
        let b = read(r#"{"n": 1, "m": null}"#).unwrap();
        assert_eq!((b.n, b.m), (1, None));
        assert_eq!(read(r#"{"n": 1}"#).unwrap().m, None);
    }

    #[test]
    fn a_fraction_a_negative_a_too_large_or_a_text_number_is_refused() {
        for bad in [
            r#"{"n": 1.5}"#,
            r#"{"n": -1}"#,
            r#"{"n": 4294967296}"#,
            r#"{"n": "3"}"#,
            r#"{"n": 1e300}"#,
            r#"{"n": 1, "m": -2.0}"#,
        ] {
            assert!(read(bad).is_err(), "{bad} was read");
        }
        assert!(read(r#"{"n": 1.5}"#).unwrap_err().contains("a whole number"));
    }
}
