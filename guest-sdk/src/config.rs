//! Reading task config values: what every runner that takes durations in its task config
//! needs, worded the same in every runner's errors.

use std::time::Duration;

/// Parses a duration as jobs write them: a whole number and a unit, `ms`, `s`, `m` or `h`
/// (`500ms`, `5s`, `2m`). The error says what was given and what is expected, ready to go
/// after the key in a [`crate::RunnerError::InvalidConfig`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let not_a_duration = || format!("{text:?} is not a duration such as 500ms, 5s or 2m");
    let number: u64 = digits.parse().map_err(|_| not_a_duration())?;
    let unit_millis: u64 = match &text[digits.len()..] {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(not_a_duration()),
    };
    number
        .checked_mul(unit_millis)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
}
