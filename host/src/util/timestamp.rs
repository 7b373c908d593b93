//! The clock as Unix milliseconds, and RFC 3339 UTC timestamps for log lines
//! (`2026-12-01T18:09:42.791781Z`), the agent log's and the alloc log files'. Both write one
//! for every line a guest logs, so the date and time of day are formatted once per second per
//! thread and only the fraction each time.
//!
//! Also a time for people, in the local zone (`write_local`), for the CLI's tables.
//!
//! A leaf: it knows the clock, the calendar and the local zone (from the C library), nothing
//! of logs.

use std::cell::RefCell;
use std::fmt::{self, Write};
use std::time::{SystemTime, UNIX_EPOCH};

/// How many digits of the second a timestamp has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fraction {
    /// `.816`
    Millis,
    /// `.816123`
    Micros,
}

thread_local! {
    /// The last second this thread formatted, and its `YYYY-MM-DDTHH:MM:SS`.
    static SECOND: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// Milliseconds since the Unix epoch now, as events and records carry times (0 for a clock
/// before 1970).
pub fn unix_ms_now() -> u64 {
    unix_ms(super::determinism::wall_clock())
}

/// Milliseconds since the Unix epoch at `at` (0 for a time before 1970).
pub fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Writes `at` as `YYYY-MM-DDTHH:MM:SS.fffZ` or `...ffffffZ`, in UTC.
pub fn write_utc(w: &mut impl Write, at: SystemTime, fraction: Fraction) -> fmt::Result {
    // A clock before 1970 is shown as 1970: a log line is no place to fail.
    let since_epoch = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since_epoch.as_secs();
    SECOND.with_borrow_mut(|(cached, text)| {
        if *cached != seconds {
            text.clear();
            write_date_time(text, seconds)?;
            *cached = seconds;
        }
        w.write_str(text)
    })?;
    match fraction {
        Fraction::Millis => write_fraction(w, since_epoch.subsec_millis(), 3),
        Fraction::Micros => write_fraction(w, since_epoch.subsec_micros(), 6),
    }
}

/// Writes `.` and the `digits` last digits of `value`, zero-padded, and `Z`. By hand, not
/// with `write!`: this is on the path of every line a guest logs.
fn write_fraction(w: &mut impl Write, mut value: u32, digits: usize) -> fmt::Result {
    let mut text = *b".000000Z";
    for at in (1..=digits).rev() {
        text[at] = b'0' + (value % 10) as u8;
        value /= 10;
    }
    text[digits + 1] = b'Z';
    // Only ASCII digits were written.
    w.write_str(std::str::from_utf8(&text[..digits + 2]).unwrap_or_default())
}

/// `unix_ms` as an RFC 3339 UTC timestamp to the millisecond (`2026-12-01T18:09:42.791Z`),
/// as the API's JSON shows times next to their Unix milliseconds.
pub fn rfc3339_from_unix_ms(unix_ms: u64) -> String {
    let mut text = String::with_capacity(24);
    let at = UNIX_EPOCH + std::time::Duration::from_millis(unix_ms);
    write_utc(&mut text, at, Fraction::Millis).expect("a String takes every write");
    text
}

/// Writes `at` for people: the local date and time to the second, with the zone's offset
/// from UTC (`2026-12-01 23:41:07 +01:00`), in the zone the C library reads from `TZ` or
/// `/etc/localtime`; in UTC (`+00:00`) when it cannot tell.
pub fn write_local(w: &mut impl Write, at: SystemTime) -> fmt::Result {
    let seconds = at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let offset = local_offset_seconds(seconds).unwrap_or(0);
    let local = seconds.saturating_add_signed(offset);
    let mut text = String::with_capacity(19);
    write_date_time(&mut text, local)?;
    let (sign, minutes) = (
        if offset < 0 { '-' } else { '+' },
        offset.unsigned_abs() / 60,
    );
    write!(
        w,
        "{} {sign}{:02}:{:02}",
        text.replacen('T', " ", 1),
        minutes / 60,
        minutes % 60
    )
}

/// The local zone's offset from UTC, in seconds, at `unix_seconds`.
fn local_offset_seconds(unix_seconds: u64) -> Option<i64> {
    let time: libc::time_t = unix_seconds.try_into().ok()?;
    // SAFETY: `tm` is plain data, for which all zeroes is a valid value.
    #[allow(unsafe_code)]
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: localtime_r is the reentrant form: it reads `time` and writes only `tm`, both
    // alive for the call, and returns null on failure.
    #[allow(unsafe_code)]
    let converted = unsafe { libc::localtime_r(&time, &mut tm) };
    // `c_long` is `i64` here, `i32` on 32-bit targets.
    #[allow(clippy::useless_conversion)]
    let offset = i64::from(tm.tm_gmtoff);
    (!converted.is_null()).then_some(offset)
}

/// `YYYY-MM-DDTHH:MM:SS` of a Unix time, in the proleptic Gregorian calendar.
fn write_date_time(w: &mut impl Write, unix_seconds: u64) -> fmt::Result {
    let (year, month, day) = civil_from_days(unix_seconds / 86_400);
    let of_day = unix_seconds % 86_400;
    write!(
        w,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    )
}

/// The calendar date `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`): eras of
/// 400 years (146,097 days) that start on 1 March, so a leap day ends its year.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let shifted = days + 719_468; // days from 0000-03-01 to 1970-01-01
    let era = shifted / 146_097;
    let day_of_era = shifted % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn utc(unix_micros: u64, fraction: Fraction) -> String {
        let mut text = String::new();
        write_utc(
            &mut text,
            UNIX_EPOCH + Duration::from_micros(unix_micros),
            fraction,
        )
        .unwrap();
        text
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        use Fraction::*;
        assert_eq!(utc(0, Micros), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            utc(1_796_058_410_964_123, Micros),
            "2026-11-30T17:06:50.964123Z"
        );
        assert_eq!(
            utc(1_796_058_410_964_123, Millis),
            "2026-11-30T17:06:50.964Z"
        );
        // Leap days, and the turn of a century that is not a leap year.
        assert_eq!(utc(951_782_400_000_000, Millis), "2000-02-29T00:00:00.000Z");
        assert_eq!(
            utc(4_107_542_399_000_000, Millis),
            "2100-02-28T23:59:59.000Z"
        );
        assert_eq!(
            utc(4_107_542_400_000_000, Millis),
            "2100-03-01T00:00:00.000Z"
        );
        // The cached second is not reused for the next one.
        assert_eq!(utc(1_500_000, Micros), "1970-01-01T00:00:01.500000Z");
        assert_eq!(utc(2_000_001, Micros), "1970-01-01T00:00:02.000001Z");
    }
}
