//! Versioned checkpoints: the bytes every Caravan SDK (Rust, Python, JavaScript, C) writes, so
//! that a new build of a runner, in any of them, can tell an old checkpoint from its own.
//!
//! The format is a header line naming the version, then your data as it is:
//! `caravan-checkpoint v1\n<data>`.

use crate::RunnerError;

const HEADER: &[u8] = b"caravan-checkpoint v";

/// `data` under a header naming its `version`.
///
/// ```
/// let bytes = caravan_guest::encode_checkpoint(2, b"count=7");
/// assert_eq!(bytes, b"caravan-checkpoint v2\ncount=7");
/// ```
pub fn encode_checkpoint(version: u32, data: &[u8]) -> Vec<u8> {
    let mut bytes = format!("caravan-checkpoint v{version}\n").into_bytes();
    bytes.extend_from_slice(data);
    bytes
}

/// The version and data of a checkpoint [`encode_checkpoint`] wrote (in any SDK); a
/// [`RunnerError::Failed`] saying so for anything else.
///
/// ```
/// let (version, data) = caravan_guest::decode_checkpoint(b"caravan-checkpoint v1\ncount=7")?;
/// assert_eq!((version, data), (1, &b"count=7"[..]));
/// assert!(caravan_guest::decode_checkpoint(b"count=7").is_err());
/// # Ok::<(), caravan_guest::RunnerError>(())
/// ```
pub fn decode_checkpoint(raw: &[u8]) -> Result<(u32, &[u8]), RunnerError> {
    let no_header =
        || RunnerError::Failed("the restored checkpoint has no caravan-checkpoint header".into());
    let rest = raw.strip_prefix(HEADER).ok_or_else(no_header)?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 10 || rest.get(digits) != Some(&b'\n') {
        return Err(no_header());
    }
    let version = std::str::from_utf8(&rest[..digits])
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(no_header)?;
    Ok((version, &rest[digits + 1..]))
}
