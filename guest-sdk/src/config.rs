//! Reading task config values: what every runner that takes durations in its task config
//! needs, worded the same in every runner's errors.

use std::time::Duration;

/// Parses a duration as jobs write them: a whole number and a unit, `ms`, `s`, `m` or `h`
/// (`500ms`, `5s`, `2m`). The error says what was given and what is expected, ready to go
/// after the key in a [`crate::RunnerError::InvalidConfig`].
///
/// ```
/// use std::time::Duration;
/// assert_eq!(caravan_guest::parse_duration("500ms"), Ok(Duration::from_millis(500)));
/// assert_eq!(caravan_guest::parse_duration("2m"), Ok(Duration::from_secs(120)));
/// assert!(caravan_guest::parse_duration("soon").is_err());
/// ```
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

/// One task's config, read key by key. Its errors name the task and the key, as the host
/// shows them in the alloc's description (`task "web": run_for: "soon" is not a duration ...`).
///
/// ```
/// use caravan_guest::{RunnerError, Task, TaskConfig};
/// use std::time::Duration;
/// let task = Task {
///     name: "web".into(),
///     config: vec![("run_for".into(), "5s".into()), ("mode".into(), "fast".into())],
/// };
/// let config = TaskConfig::of(&task);
/// assert_eq!(config.duration("run_for")?, Some(Duration::from_secs(5)));
/// assert_eq!(config.get("mode"), Some("fast"));
/// assert_eq!(config.duration("log_every")?, None);
/// let bad = Task { name: "web".into(), config: vec![("run_for".into(), "soon".into())] };
/// assert!(matches!(
///     TaskConfig::of(&bad).duration("run_for"),
///     Err(RunnerError::InvalidConfig(message)) if message.starts_with("task \"web\": run_for:")
/// ));
/// # Ok::<(), RunnerError>(())
/// ```
pub struct TaskConfig<'a> {
    task: &'a crate::Task,
}

impl<'a> TaskConfig<'a> {
    /// The config of `task`.
    pub fn of(task: &'a crate::Task) -> Self {
        TaskConfig { task }
    }

    /// The value of `key`, if the job file sets it (the first, if it sets it twice).
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.task
            .config
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// `key` as a duration (see [`parse_duration`]), if set.
    pub fn duration(&self, key: &str) -> Result<Option<Duration>, crate::RunnerError> {
        self.get(key)
            .map(parse_duration)
            .transpose()
            .map_err(|why| self.invalid(key, why))
    }

    /// `key` as a whole number that fits an `i64`, if set.
    ///
    /// ```
    /// use caravan_guest::{Task, TaskConfig};
    /// let task = Task { name: "web".into(), config: vec![("exit_code".into(), "-3".into())] };
    /// assert_eq!(TaskConfig::of(&task).whole_number("exit_code")?, Some(-3));
    /// # Ok::<(), caravan_guest::RunnerError>(())
    /// ```
    pub fn whole_number(&self, key: &str) -> Result<Option<i64>, crate::RunnerError> {
        match self.get(key) {
            None => Ok(None),
            Some(text) => text
                .parse()
                .map(Some)
                .map_err(|_| self.invalid(key, format!("{text:?} is not a whole number"))),
        }
    }

    /// The error for a value of `key` that cannot be used, `why` saying what is wrong.
    pub fn invalid(&self, key: &str, why: String) -> crate::RunnerError {
        crate::RunnerError::InvalidConfig(format!("task {:?}: {key}: {why}", self.task.name))
    }
}

/// What a runner returns from `next_wakeup` when it has things to do at `deadlines`: the
/// time until the earliest (zero if it has passed), or `None` to wait for events only.
///
/// ```
/// use std::time::{Duration, Instant};
/// let now = Instant::now();
/// let soonest = caravan_guest::wakeup_for([now + Duration::from_secs(9), now + Duration::from_secs(2)]);
/// assert!(soonest.is_some_and(|wait| wait <= Duration::from_secs(2)));
/// assert_eq!(caravan_guest::wakeup_for([]), None);
/// ```
pub fn wakeup_for(deadlines: impl IntoIterator<Item = std::time::Instant>) -> Option<Duration> {
    let now = std::time::Instant::now();
    deadlines
        .into_iter()
        .map(|at| at.saturating_duration_since(now))
        .min()
}
