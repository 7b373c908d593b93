//! The limits one alloc runs under: every key a job may set in `[job.limits]`, the agent's
//! defaults for them (`[client.limits]`) and its caps (`[client.limit_caps]`), and the one
//! parser all three and `caravan run --limit` share.
//!
//! Each limit is declared once, in the table inside `declare_limits!` at the end of this file:
//! its field, its key, the kind of value it takes, its default and its cap. Everything a limit
//! needs (the fields of [`Limits`], [`LimitOverrides`] and [`LimitCaps`], parsing, the cap
//! check, the list of keys in messages) is made from that table, so a new limit is one line
//! there plus the code that enforces it.
//!
//! This module is plain data: it enforces nothing (the runtime does) and reads no file.

pub use crate::model::written::AsWritten;
use crate::util::units::{format_bytes, format_duration, parse_bytes, parse_duration};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The kind of value a limit takes: how it is typed and shown.
pub trait LimitKind {
    /// The value as the runtime uses it.
    type Value: Copy + Ord + std::fmt::Debug;
    /// What a value of this kind looks like, for messages.
    const EXPECTED: &'static str;
    /// Reads a value as typed, without checking it is [`LimitKind::valid`].
    fn read(text: &str) -> Option<Self::Value>;
    /// Whether `value` may be a limit of this kind: 0 only where it means something (a
    /// timeout's "at once"), never where it would fail every alloc.
    fn valid(value: Self::Value) -> bool;
    /// Reads a value as typed; `None` when it is not one, or not valid.
    fn parse(text: &str) -> Option<Self::Value> {
        Self::read(text).filter(|&value| Self::valid(value))
    }
    /// Shows a value for people, in messages.
    fn show(value: Self::Value) -> String;
}

/// A size in bytes: `64MiB`, `512KiB`, or a whole number of bytes.
pub struct Bytes;

impl LimitKind for Bytes {
    type Value = u64;
    const EXPECTED: &'static str = "a size above 0 such as 64MiB";
    fn read(text: &str) -> Option<u64> {
        parse_bytes(text).ok()
    }
    fn valid(value: u64) -> bool {
        value > 0
    }
    fn show(value: u64) -> String {
        format_bytes(value)
    }
}

/// A length of time: `500ms`, `5s`, `1h`.
pub struct Time;

impl LimitKind for Time {
    type Value = Duration;
    const EXPECTED: &'static str = "a duration above 0 such as 5s";
    fn read(text: &str) -> Option<Duration> {
        parse_duration(text).ok()
    }
    fn valid(value: Duration) -> bool {
        !value.is_zero()
    }
    fn show(value: Duration) -> String {
        format_duration(value)
    }
}

/// A timeout: a length of time, where 0 means "at once" (`kill_timeout = "0s"` tears a runner
/// down without waiting, as Nomad's does).
pub struct Timeout;

impl LimitKind for Timeout {
    type Value = Duration;
    const EXPECTED: &'static str = "a duration such as 5s";
    fn read(text: &str) -> Option<Duration> {
        parse_duration(text).ok()
    }
    fn valid(_: Duration) -> bool {
        true
    }
    fn show(value: Duration) -> String {
        format_duration(value)
    }
}

/// A whole number above 0.
pub struct Count;

impl LimitKind for Count {
    type Value = u32;
    const EXPECTED: &'static str = "a whole number above 0";
    fn read(text: &str) -> Option<u32> {
        text.parse().ok()
    }
    fn valid(value: u32) -> bool {
        value > 0
    }
    fn show(value: u32) -> String {
        value.to_string()
    }
}

/// A percentage of one core, from 1 to 100.
pub struct Percent;

impl LimitKind for Percent {
    type Value = u32;
    const EXPECTED: &'static str = "a whole percentage from 1 to 100";
    fn read(text: &str) -> Option<u32> {
        text.strip_suffix('%').unwrap_or(text).trim().parse().ok()
    }
    fn valid(value: u32) -> bool {
        (1..=100).contains(&value)
    }
    fn show(value: u32) -> String {
        format!("{value}%")
    }
}

/// Why a limit could not be set. Names the key, never the file or flag: callers add that.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// No limit has this key.
    #[error("unknown limit {key:?}; known limits are {}", LimitOverrides::KEYS.join(", "))]
    Unknown {
        /// The key as typed.
        key: String,
    },
    /// The value is not one of the key's kind.
    #[error("{key}: {}", self.problem())]
    BadValue {
        /// The limit's key.
        key: &'static str,
        /// What the key takes.
        expected: &'static str,
        /// The value as typed.
        text: String,
    },
}

impl LimitError {
    /// The limit's key, when the key is known.
    pub fn key(&self) -> Option<&'static str> {
        match self {
            LimitError::Unknown { .. } => None,
            LimitError::BadValue { key, .. } => Some(key),
        }
    }

    /// The setting at fault under `section` (such as `job.limits`): the key's full name, or
    /// the section itself for an unknown key.
    pub fn field(&self, section: &str) -> String {
        match self.key() {
            Some(key) => format!("{section}.{key}"),
            None => section.into(),
        }
    }

    /// What is wrong, without the key.
    pub fn problem(&self) -> String {
        match self {
            LimitError::Unknown { .. } => self.to_string(),
            LimitError::BadValue { expected, text, .. } => {
                format!("expected {expected}, not {text:?}")
            }
        }
    }
}

/// A limit asked above its cap: which, and by how much.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("job.limits.{key}: {asked} is over this agent's cap of {cap} (client.limit_caps.{key})")]
pub struct OverCap {
    /// The limit's key, such as `memory`.
    pub key: &'static str,
    /// What was asked, for people.
    pub asked: String,
    /// The cap, for people.
    pub cap: String,
}

impl OverCap {
    /// The job file's key at fault: `job.limits.memory`.
    pub fn field(&self) -> String {
        format!("job.limits.{}", self.key)
    }
}

/// A limit's value as a TOML or JSON document holds it: text (`"64MiB"`) or a number. Read
/// into text, which [`LimitOverrides::set`] parses by the key's kind, so that a value of the
/// wrong type is refused naming its key (a JSON `null` is no value: see [`RawLimits`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawLimitValue(pub String);

impl<'de> Deserialize<'de> for RawLimitValue {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = RawLimitValue;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a text value such as \"64MiB\" or a whole number")
            }
            fn visit_str<E>(self, text: &str) -> Result<RawLimitValue, E> {
                Ok(RawLimitValue(text.into()))
            }
            fn visit_u64<E>(self, n: u64) -> Result<RawLimitValue, E> {
                Ok(RawLimitValue(n.to_string()))
            }
            fn visit_i64<E>(self, n: i64) -> Result<RawLimitValue, E> {
                Ok(RawLimitValue(n.to_string()))
            }
            fn visit_f64<E>(self, n: f64) -> Result<RawLimitValue, E> {
                Ok(RawLimitValue(n.to_string()))
            }
            fn visit_bool<E>(self, b: bool) -> Result<RawLimitValue, E> {
                Ok(RawLimitValue(b.to_string()))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// `[job.limits]`, `[client.limits]` or `[client.limit_caps]` as a document holds it: keys
/// and values, still unparsed ([`LimitOverrides::from_raw`] parses them). A key set to JSON
/// `null` is left unset.
pub type RawLimits = std::collections::BTreeMap<String, Option<RawLimitValue>>;

impl LimitOverrides {
    /// Parses every key of a `[... limits]` table; the first bad key or value is the error.
    pub fn from_raw(raw: &RawLimits) -> Result<LimitOverrides, LimitError> {
        Self::from_raw_all(raw).map_err(|mut errors| errors.remove(0))
    }

    /// Parses every key of a `[... limits]` table; every bad key or value is an error, in
    /// the keys' order.
    pub fn from_raw_all(raw: &RawLimits) -> Result<LimitOverrides, Vec<LimitError>> {
        let mut overrides = LimitOverrides::default();
        let mut errors = Vec::new();
        for (key, value) in raw {
            if let Some(value) = value
                && let Err(error) = overrides.set(key, &value.0)
            {
                errors.push(error);
            }
        }
        if errors.is_empty() {
            Ok(overrides)
        } else {
            Err(errors)
        }
    }
}

/// A byte limit as a length in memory (a limit past the address space is no limit).
pub fn as_len(bytes: u64) -> usize {
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

impl Limits {
    /// Where limits contradict each other, a message naming them: a checkpoint is one host
    /// call, so it must fit in the host-call allowance to get its own error when over; and a
    /// longest line with its context must fit in a second's log bytes, or it is never kept.
    pub fn conflict(&self) -> Option<String> {
        if self.checkpoint_bytes > self.hostcall_bytes {
            return Some(format!(
                "checkpoint_size ({}) is over hostcall_size ({}): a checkpoint is one host call",
                format_bytes(self.checkpoint_bytes),
                format_bytes(self.hostcall_bytes)
            ));
        }
        let longest_line = self.log_line_bytes.saturating_add(self.log_field_bytes);
        (longest_line > self.log_bytes_per_second).then(|| {
            format!(
                "log_line_size and log_field_size together ({}) are over log_bytes_rate ({}): \
                 a line that long would never be kept",
                format_bytes(longest_line),
                format_bytes(self.log_bytes_per_second)
            )
        })
    }
}

macro_rules! declare_limits {
    ($(
        $(#[doc = $doc:literal])*
        $field:ident: $key:literal, $kind:ty, default $default:expr, cap $cap:expr;
    )*) => {
        /// The limits one alloc runs under, all set. A field missing from a serialized copy
        /// reads as its default.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(default)]
        pub struct Limits {
            $( $(#[doc = $doc])* pub $field: <$kind as LimitKind>::Value, )*
            /// Time from start after which the host stops the guest and fails the alloc;
            /// `None` (the default) means none: services run until stopped. It has no cap:
            /// a runner that waits costs its memory, which `memory` caps, and no CPU.
            pub wall_time: Option<Duration>,
        }

        impl Default for Limits {
            fn default() -> Self {
                Limits { $( $field: $default, )* wall_time: None }
            }
        }

        /// Limits as a job (or an agent's config) states them: unset ones take the defaults.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(default)]
        pub struct LimitOverrides {
            $( #[doc = concat!("`", $key, "`, when set.")] pub $field: Option<<$kind as LimitKind>::Value>, )*
            /// `wall_time`, when set.
            pub wall_time: Option<Duration>,
            /// How each key set from a document was written, for saying it back.
            #[serde(skip_serializing_if = "AsWritten::is_empty")]
            pub written: AsWritten,
        }

        impl LimitOverrides {
            /// Checks every value set is one its key could have been parsed into: for
            /// overrides read back from the state store, which parsing never saw.
            pub fn check_values(&self) -> Result<(), LimitError> {
                fn check<K: LimitKind>(key: &'static str, value: Option<K::Value>) -> Result<(), LimitError> {
                    match value {
                        Some(value) if !K::valid(value) => Err(LimitError::BadValue {
                            key,
                            expected: K::EXPECTED,
                            text: K::show(value),
                        }),
                        _ => Ok(()),
                    }
                }
                $( check::<$kind>($key, self.$field)?; )*
                check::<Time>("wall_time", self.wall_time)
            }

            /// Every key, in the order of the table.
            pub const KEYS: &'static [&'static str] = &[$( $key, )* "wall_time"];

            /// Sets the limit `key` (a job file's key, exactly) from `text`.
            pub fn set(&mut self, key: &str, text: &str) -> Result<(), LimitError> {
                fn parse<K: LimitKind>(key: &'static str, text: &str) -> Result<K::Value, LimitError> {
                    K::parse(text.trim()).ok_or_else(|| LimitError::BadValue {
                        key,
                        expected: K::EXPECTED,
                        text: text.into(),
                    })
                }
                match key {
                    $( $key => self.$field = Some(parse::<$kind>($key, text)?), )*
                    "wall_time" => self.wall_time = Some(parse::<Time>("wall_time", text)?),
                    _ => return Err(LimitError::Unknown { key: key.into() }),
                }
                self.written.record(key, text);
                Ok(())
            }
        }

        impl Limits {
            /// These limits with `overrides` applied.
            pub fn with_overrides(self, overrides: &LimitOverrides) -> Limits {
                Limits {
                    $( $field: overrides.$field.unwrap_or(self.$field), )*
                    wall_time: overrides.wall_time.or(self.wall_time),
                }
            }

            /// Every limit as a job file writes it, key and value, in the order of the table
            /// (`wall_time` last, `none` when unset).
            pub fn shown(&self) -> Vec<(&'static str, String)> {
                let mut shown = vec![$( ($key, <$kind as LimitKind>::show(self.$field)), )*];
                shown.push(("wall_time", self.wall_time.map_or_else(|| "none".into(), Time::show)));
                shown
            }

            /// Every limit set, as overrides: what checking the agent's own defaults against
            /// its caps needs.
            pub fn as_overrides(&self) -> LimitOverrides {
                LimitOverrides {
                    $( $field: Some(self.$field), )*
                    wall_time: self.wall_time,
                    written: AsWritten::default(),
                }
            }
        }

        /// The most a job may ask of an agent, per limit (`[client.limit_caps]`). A job asking
        /// for more is refused when it is submitted, naming the key: without caps, a job could
        /// ask one node for any memory, CPU or disk.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct LimitCaps {
            $( #[doc = concat!("The cap on `", $key, "`.")] pub $field: <$kind as LimitKind>::Value, )*
        }

        impl Default for LimitCaps {
            fn default() -> Self {
                LimitCaps { $( $field: $cap, )* }
            }
        }

        impl LimitCaps {
            /// The first limit of `limits` over its cap, in the order of the table.
            pub fn check(&self, limits: &LimitOverrides) -> Result<(), OverCap> {
                $(
                    if let Some(asked) = limits.$field.filter(|&asked| asked > self.$field) {
                        return Err(OverCap {
                            key: $key,
                            asked: limits
                                .written
                                .get($key)
                                .map_or_else(|| <$kind as LimitKind>::show(asked), str::to_string),
                            cap: <$kind as LimitKind>::show(self.$field),
                        });
                    }
                )*
                Ok(())
            }

            /// These caps with `overrides` applied (`wall_time` has no cap: see [`Limits`]).
            pub fn with_overrides(self, overrides: &LimitOverrides) -> LimitCaps {
                LimitCaps { $( $field: overrides.$field.unwrap_or(self.$field), )* }
            }
        }
    };
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

declare_limits! {
    /// Bytes all linear memories of the instance may hold together. Default 64 MiB: plenty
    /// for a runner that supervises tasks rather than doing their work.
    memory_bytes: "memory", Bytes, default 64 * MIB, cap GIB;
    /// Time spent computing, the guest's own and the host's work on its behalf. Default 60 s:
    /// runners mostly wait, and waiting is free, so only a runner that computes without end
    /// runs out.
    cpu: "cpu", Time, default Duration::from_secs(60), cap Duration::from_secs(3600);
    /// Percent of one core the runner may compute, over any second: past it the guest is
    /// paused until its share catches up. Default 100 (a guest runs on one thread at most).
    cpu_share: "cpu_share", Percent, default 100, cap 100;
    /// How long `kill` may take. Default 5 s, Nomad's default; cap 30 s, its `max_kill_timeout`.
    kill_timeout: "kill_timeout", Timeout, default Duration::from_secs(5), cap Duration::from_secs(30);
    /// Guest log lines per second, with a burst of the same size; the excess is dropped.
    log_lines_per_second: "log_rate", Count, default 1_000, cap 10_000;
    /// Guest log bytes per second (messages and contexts), with a burst of the same size: the
    /// line rate alone would let a guest write 8 KiB lines a thousand times a second.
    log_bytes_per_second: "log_bytes_rate", Bytes, default 256 * KIB, cap 4 * MIB;
    /// Longest guest log line kept; longer ones are cut with a marker saying how much.
    log_line_bytes: "log_line_size", Bytes, default 8 * KIB, cap 64 * KIB;
    /// Longest `wasi:logging` context kept (a context names a module or a component).
    log_field_bytes: "log_field_size", Bytes, default 256, cap 4 * KIB;
    /// Largest checkpoint; a larger one gets an error naming the limit.
    checkpoint_bytes: "checkpoint_size", Bytes, default MIB, cap 16 * MIB;
    /// Checkpoint bytes per second, each checkpoint counting at least 4 KiB, with a burst of
    /// twice the largest checkpoint: the state DB's writes are the whole node's.
    checkpoint_bytes_per_second: "checkpoint_rate", Bytes, default MIB, cap 16 * MIB;
    /// Longest description or task event message kept, cut with a marker.
    description_bytes: "description_size", Bytes, default KIB, cap 16 * KIB;
    /// Bytes the alloc directory may hold (as `du` counts them): a write past it fails in the
    /// guest with "no space", and the alloc fails naming the quota.
    disk_bytes: "disk", Bytes, default GIB, cap 10 * GIB;
    /// Files and directories the alloc directory may hold.
    disk_entries: "disk_entries", Count, default 10_000, cap 1_000_000;
    /// Handles the instance may hold at once: every open file or directory is one, with a
    /// host descriptor behind it, and so is every stream and pollable.
    open_files: "open_files", Count, default 1_024, cap 1_024;
    /// Bytes one host call may copy out of the guest (wasmtime's hostcall fuel): past it the
    /// guest traps, named. A checkpoint must fit in it.
    hostcall_bytes: "hostcall_size", Bytes, default 4 * MIB, cap 64 * MIB;
}

#[cfg(test)]
mod tests;
