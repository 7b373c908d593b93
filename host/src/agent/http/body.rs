//! Request bodies: the one way a handler reads JSON it is sent, so every refusal reads
//! alike. A bad body is a 400 whose `field` names the field at fault (its path, such as
//! `ids` or `job.tasks[0].name`; the whole body is `body`), and whose message says what was
//! wrong and what a valid body looks like.
//!
//! The job document has its own parser (`jobspec`), which checks far more than its shape;
//! every other body comes through [`JsonBody`].

use super::{ApiError, ApiResult};
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

/// A body a route takes.
pub(super) trait RequestBody: DeserializeOwned {
    /// A valid body, shown in every refusal.
    const EXAMPLE: &'static str;

    /// What an empty body means: `None`, the default, refuses it.
    fn when_empty() -> Option<Self> {
        None
    }
}

/// A route's JSON body, decoded: the extractor. Its size is capped by the route's body
/// limit, as any body is.
pub(super) struct JsonBody<T>(pub T);

impl<T: RequestBody, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let text = String::from_request(request, state)
            .await
            .map_err(|refused| ApiError::new(refused.status(), refused.body_text()))?;
        decode(&text).map(JsonBody)
    }
}

/// Decodes `text` as a `T`, or refuses it naming the field at fault.
pub(super) fn decode<T: RequestBody>(text: &str) -> ApiResult<T> {
    if text.trim().is_empty() {
        return T::when_empty().ok_or_else(|| {
            ApiError::bad_request(
                "body",
                format!("the request has no body; it must be like {}", T::EXAMPLE),
            )
        });
    }
    // The common case pays for no path tracking (node RPC sends batches of megabytes); a
    // refused body is decoded again to name the field at fault.
    if let Ok(value) = serde_json::from_str(text) {
        return Ok(value);
    }
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let decoded = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        (field_at_fault(&path, &inner.to_string()), inner)
    });
    let value = decoded.and_then(|value: T| {
        deserializer
            .end()
            .map(|()| value)
            .map_err(|trailing| ("body".to_string(), trailing))
    });
    value.map_err(|(field, error)| {
        ApiError::bad_request(
            field.clone(),
            format!(
                "{field}: {error} (the request body must be like {})",
                T::EXAMPLE
            ),
        )
    })
}

/// The field a decoding error is about: its path (which names an unknown field itself), or
/// for a field missing from an object, that field (serde names it in the message, the path
/// being the object's).
fn field_at_fault(path: &str, message: &str) -> String {
    let missing = message
        .split_once("missing field `")
        .and_then(|(_, rest)| rest.split_once('`'))
        .map(|(name, _)| name);
    let at = if path == "." { "" } else { path };
    match (at, missing) {
        ("", Some(name)) => name.to_string(),
        ("", None) => "body".to_string(),
        (object, Some(name)) => format!("{object}.{name}"),
        (field, None) => field.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Signal {
        signal: String,
        #[serde(default)]
        task: Option<String>,
    }

    impl RequestBody for Signal {
        const EXAMPLE: &'static str = r#"{"signal": "SIGUSR1", "task": "web"}"#;
    }

    fn refusal(text: &str) -> (StatusCode, Option<String>, String) {
        let error = decode::<Signal>(text).unwrap_err();
        (error.status, error.field, error.message)
    }

    #[test]
    fn a_valid_body_decodes() {
        let signal: Signal = decode(r#"{"signal": "SIGHUP"}"#).unwrap();
        assert_eq!(signal.signal, "SIGHUP");
    }

    #[test]
    fn each_refusal_names_its_field_and_shows_a_valid_body() {
        for (text, field, says) in [
            (r#"{"task": "web"}"#, "signal", "missing field `signal`"),
            (r#"{"signal": 3}"#, "signal", "invalid type: integer `3`"),
            (r#"{"signal": "X", "tsk": 1}"#, "tsk", "unknown field `tsk`"),
            (r#"{"signal": "X"} trailing"#, "body", "trailing characters"),
            (r#""SIGHUP""#, "body", "invalid type: string"),
            ("", "body", "no body"),
        ] {
            let (status, named, message) = refusal(text);
            assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
            assert_eq!(named.as_deref(), Some(field), "{text}: {message}");
            assert!(message.contains(says), "{text}: {message}");
            assert!(message.contains(Signal::EXAMPLE), "{text}: {message}");
        }
    }

    #[test]
    fn a_nested_field_is_named_by_its_path() {
        assert_eq!(field_at_fault("ids[3]", "invalid type"), "ids[3]");
        assert_eq!(
            field_at_fault("updates[0]", "missing field `state`"),
            "updates[0].state"
        );
    }
}
