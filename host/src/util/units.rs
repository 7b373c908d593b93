//! Parsing and printing the sizes and durations operators type: `64MiB`, `500ms`, `5s`.
//!
//! Pure text in, numbers out: this module knows no flag, config key or job field, so callers
//! name the setting at fault when they report a [`UnitError`].

use std::time::Duration;

/// Why a size or a duration did not parse. The message quotes the text as typed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// The text does not begin with digits.
    #[error("{text:?} does not start with a whole number")]
    NotANumber {
        /// The text as typed.
        text: String,
    },
    /// The digits do not fit in 64 bits.
    #[error("number in {text:?} is too large")]
    NumberTooLarge {
        /// The text as typed.
        text: String,
    },
    /// A size's unit is not one of the known ones.
    #[error("unknown size unit {unit:?} in {text:?} (use B, KiB, MiB or GiB)")]
    UnknownSizeUnit {
        /// The unit as typed.
        unit: String,
        /// The text as typed.
        text: String,
    },
    /// The number times its unit does not fit in 64 bits.
    #[error("size {text:?} is too large")]
    SizeTooLarge {
        /// The text as typed.
        text: String,
    },
    /// A duration without a unit: a bare `5` could mean seconds or milliseconds.
    #[error("duration {text:?} needs a unit: ms, s, m or h")]
    MissingDurationUnit {
        /// The text as typed.
        text: String,
    },
    /// A duration's unit is not one of the known ones.
    #[error("unknown duration unit {unit:?} in {text:?} (use ms, s, m or h)")]
    UnknownDurationUnit {
        /// The unit as typed.
        unit: String,
        /// The text as typed.
        text: String,
    },
}

/// Parses a byte size: a whole number with an optional unit `B`, `KiB`, `MiB`, `GiB` (or the
/// decimal `KB`, `MB`, `GB`; `K`, `M`, `G` are read as the binary units).
pub fn parse_bytes(text: &str) -> Result<u64, UnitError> {
    let (number, unit) = split_number(text)?;
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        _ => {
            return Err(UnitError::UnknownSizeUnit {
                unit: unit.into(),
                text: text.into(),
            });
        }
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| UnitError::SizeTooLarge { text: text.into() })
}

/// Parses a duration: a whole number with a unit `ms`, `s`, `m` or `h`.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let (number, unit) = split_number(text)?;
    let duration = match unit {
        "ms" => Duration::from_millis(number),
        "s" => Duration::from_secs(number),
        "m" => Duration::from_secs(number.saturating_mul(60)),
        "h" => Duration::from_secs(number.saturating_mul(3600)),
        "" => return Err(UnitError::MissingDurationUnit { text: text.into() }),
        _ => {
            return Err(UnitError::UnknownDurationUnit {
                unit: unit.into(),
                text: text.into(),
            });
        }
    };
    Ok(duration)
}

/// Prints a byte size the way [`parse_bytes`] reads it, in the largest exact binary unit.
pub fn format_bytes(bytes: u64) -> String {
    for (unit, size) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{} {unit}", bytes / size);
        }
    }
    format!("{bytes} bytes")
}

/// Prints a byte size for reading, not for parsing: `17.7 MiB`, `102.6 KiB`, `512 bytes`.
pub fn format_bytes_approx(bytes: u64) -> String {
    for (unit, size) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= size {
            return format!("{:.1} {unit}", bytes as f64 / size as f64);
        }
    }
    format!("{bytes} bytes")
}

/// Prints a duration compactly: `5s`, `250ms`, `1m30s`.
pub fn format_duration(duration: Duration) -> String {
    let millis = duration.as_millis();
    if !millis.is_multiple_of(1000) || millis == 0 {
        return format!("{millis}ms");
    }
    let secs = millis / 1000;
    match (secs / 60, secs % 60) {
        (0, s) => format!("{s}s"),
        (m, 0) => format!("{m}m"),
        (m, s) => format!("{m}m{s}s"),
    }
}

fn split_number(text: &str) -> Result<(u64, &str), UnitError> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    if digits_end == 0 {
        return Err(UnitError::NotANumber { text: text.into() });
    }
    let number = trimmed[..digits_end]
        .parse::<u64>()
        .map_err(|_| UnitError::NumberTooLarge { text: text.into() })?;
    Ok((number, trimmed[digits_end..].trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_and_decimal_units() {
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("64 M"), Ok(64 << 20));
        assert_eq!(parse_bytes("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(
            parse_bytes("MiB").unwrap_err().to_string(),
            "\"MiB\" does not start with a whole number"
        );
        assert_eq!(
            parse_bytes("3 parsecs").unwrap_err().to_string(),
            "unknown size unit \"parsecs\" in \"3 parsecs\" (use B, KiB, MiB or GiB)"
        );
        assert!(matches!(
            parse_bytes("99999999999999999999GiB"),
            Err(UnitError::NumberTooLarge { .. })
        ));
        assert_eq!(
            parse_bytes("20000000000GiB").unwrap_err().to_string(),
            "size \"20000000000GiB\" is too large"
        );
    }

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(
            parse_duration("5").unwrap_err().to_string(),
            "duration \"5\" needs a unit: ms, s, m or h"
        );
        assert_eq!(
            parse_duration("5 days").unwrap_err().to_string(),
            "unknown duration unit \"days\" in \"5 days\" (use ms, s, m or h)"
        );
    }

    #[test]
    fn formatting_round_trips() {
        assert_eq!(format_bytes(64 << 20), "64 MiB");
        assert_eq!(format_bytes_approx(18_512_905), "17.7 MiB");
        assert_eq!(format_bytes_approx(512), "512 bytes");
        assert_eq!(format_bytes(1000), "1000 bytes");
        assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_duration(Duration::from_secs(5)), "5s");
    }
}
