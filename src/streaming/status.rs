//! How an exec or attach ended, written to the client's error stream: a Kubernetes `Status`
//! object from `v4.channel.k8s.io` on, a plain message on failure before that.

use serde::Serialize;

/// The end of an exec or attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// The command ran and exited non-zero.
    ExitCode {
        cmd: Vec<String>,
        code: i32,
    },
    /// It could not run, or broke.
    Internal(String),
}

#[derive(Serialize)]
struct Status<'a> {
    metadata: Empty,
    status: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Details>,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<u16>,
}

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
struct Details {
    causes: Vec<Cause>,
}

#[derive(Serialize)]
struct Cause {
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    message: String,
}

impl Outcome {
    fn message(&self) -> Option<String> {
        match self {
            Outcome::Success => None,
            Outcome::ExitCode { cmd, code } => Some(format!(
                "command terminated with non-zero exit code: error executing command [{}], exit code {code}",
                cmd.join(" ")
            )),
            Outcome::Internal(message) => Some(format!("Internal error occurred: {message}")),
        }
    }

    /// The `Status` JSON of `v4.channel.k8s.io` and later, written in every case.
    pub fn status_json(&self) -> Vec<u8> {
        let status = match self {
            Outcome::Success => Status {
                metadata: Empty {},
                status: "Success",
                message: None,
                reason: None,
                details: None,
                code: None,
            },
            Outcome::ExitCode { code, .. } => Status {
                metadata: Empty {},
                status: "Failure",
                message: self.message(),
                reason: Some("NonZeroExitCode"),
                details: Some(Details {
                    causes: vec![Cause {
                        reason: Some("ExitCode"),
                        message: code.to_string(),
                    }],
                }),
                code: None,
            },
            Outcome::Internal(message) => Status {
                metadata: Empty {},
                status: "Failure",
                message: self.message(),
                reason: Some("InternalError"),
                details: Some(Details {
                    causes: vec![Cause {
                        reason: None,
                        message: message.clone(),
                    }],
                }),
                code: Some(500),
            },
        };
        // Serialising this struct cannot fail; an empty status would still end the stream.
        serde_json::to_vec(&status).unwrap_or_default()
    }

    /// What protocols before v4 write: the message, only on failure.
    pub fn legacy_message(&self) -> Option<Vec<u8>> {
        self.message().map(String::into_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_is_a_bare_success_status() {
        assert_eq!(
            String::from_utf8(Outcome::Success.status_json()).unwrap(),
            r#"{"metadata":{},"status":"Success"}"#
        );
        assert_eq!(Outcome::Success.legacy_message(), None);
    }

    #[test]
    fn a_non_zero_exit_carries_the_code_as_the_cause() {
        let outcome = Outcome::ExitCode {
            cmd: vec!["sh".into(), "-c".into(), "exit 7".into()],
            code: 7,
        };
        assert_eq!(
            String::from_utf8(outcome.status_json()).unwrap(),
            concat!(
                r#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: "#,
                r#"error executing command [sh -c exit 7], exit code 7","reason":"NonZeroExitCode","#,
                r#""details":{"causes":[{"reason":"ExitCode","message":"7"}]}}"#
            )
        );
    }

    #[test]
    fn internal_errors_say_so() {
        let json: serde_json::Value =
            serde_json::from_slice(&Outcome::Internal("boom".into()).status_json()).unwrap();
        assert_eq!(json["reason"], "InternalError");
        assert_eq!(json["code"], 500);
        assert_eq!(json["details"]["causes"][0]["message"], "boom");
        assert_eq!(
            Outcome::Internal("boom".into()).legacy_message().unwrap(),
            b"Internal error occurred: boom"
        );
    }
}
