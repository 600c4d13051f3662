//! Registry credentials and authentication challenges (`WWW-Authenticate: Basic ...` and
//! `Bearer realm=...,service=...,scope=...`).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use crate::config::RegistryAuth;

/// Credentials for one registry, from the CRI request or crius's config.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
    /// An OAuth2 refresh token, exchanged at the token endpoint for an access token.
    pub identity_token: String,
    /// A bearer token sent to the registry as it is.
    pub registry_token: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never log secrets.
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &(!self.password.is_empty()))
            .field("identity_token", &(!self.identity_token.is_empty()))
            .field("registry_token", &(!self.registry_token.is_empty()))
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid registry credentials: {0}")]
pub struct CredentialsError(pub String);

impl Credentials {
    pub fn is_empty(&self) -> bool {
        self.username.is_empty()
            && self.password.is_empty()
            && self.identity_token.is_empty()
            && self.registry_token.is_empty()
    }

    /// From the parts of a CRI `AuthConfig` or a config `[registry.configs.<host>.auth]`;
    /// `auth` is base64 of `username:password` and fills in what is not given.
    pub fn from_parts(
        username: &str,
        password: &str,
        auth: &str,
        identity_token: &str,
        registry_token: &str,
    ) -> Result<Self, CredentialsError> {
        let mut creds = Self {
            username: username.to_string(),
            password: password.to_string(),
            identity_token: identity_token.to_string(),
            registry_token: registry_token.to_string(),
        };
        if !auth.is_empty() && creds.username.is_empty() {
            let decoded = BASE64
                .decode(auth.trim())
                .map_err(|e| CredentialsError(format!("\"auth\" is not base64: {e}")))?;
            let text = String::from_utf8(decoded)
                .map_err(|_| CredentialsError("\"auth\" is not UTF-8".to_string()))?;
            let (user, pass) = text.split_once(':').ok_or_else(|| {
                CredentialsError("\"auth\" must encode username:password".to_string())
            })?;
            creds.username = user.to_string();
            creds.password = pass.to_string();
        }
        Ok(creds)
    }

    pub fn from_config(auth: &RegistryAuth) -> Result<Self, CredentialsError> {
        Self::from_parts(
            &auth.username,
            &auth.password,
            &auth.auth,
            &auth.identitytoken,
            "",
        )
    }

    /// The `Authorization` value for HTTP Basic, when there is a username.
    pub fn basic_header(&self) -> Option<String> {
        (!self.username.is_empty()).then(|| {
            format!(
                "Basic {}",
                BASE64.encode(format!("{}:{}", self.username, self.password))
            )
        })
    }
}

/// One parsed `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// Parses the first supported challenge of a `WWW-Authenticate` header value.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, params) = header.split_once(' ').unwrap_or((header, ""));
    let params = parse_params(params);
    let get = |key: &str| {
        params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.clone())
    };
    if scheme.eq_ignore_ascii_case("basic") {
        Some(Challenge::Basic)
    } else if scheme.eq_ignore_ascii_case("bearer") {
        Some(Challenge::Bearer {
            realm: get("realm")?,
            service: get("service"),
            scope: get("scope"),
        })
    } else {
        None
    }
}

/// `key="value", key2=value2` with quoted values that may contain commas.
fn parse_params(text: &str) -> Vec<(String, String)> {
    let mut params = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let Some(eq) = rest.find('=') else { break };
        let key = rest[..eq].trim().trim_start_matches(',').trim().to_string();
        rest = rest[eq + 1..].trim_start();
        let value;
        if let Some(quoted) = rest.strip_prefix('"') {
            let mut out = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, escaped)) = chars.next() {
                            out.push(escaped);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => out.push(c),
                }
            }
            value = out;
            rest = &quoted[end.min(quoted.len())..];
        } else {
            let end = rest.find(',').unwrap_or(rest.len());
            value = rest[..end].trim().to_string();
            rest = &rest[end..];
        }
        rest = rest.trim_start().trim_start_matches(',').trim_start();
        params.push((key, value));
    }
    params
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bearer_and_basic_challenges() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:a/b:pull,push""#,
        )
        .unwrap();
        assert_eq!(
            c,
            Challenge::Bearer {
                realm: "https://auth.example.com/token".into(),
                service: Some("registry.example.com".into()),
                scope: Some("repository:a/b:pull,push".into()),
            }
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="basic-realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(
            parse_challenge("bearer realm=http://t/token"),
            Some(Challenge::Bearer {
                realm: "http://t/token".into(),
                service: None,
                scope: None
            })
        );
        assert_eq!(parse_challenge("Negotiate abc"), None);
        assert_eq!(parse_challenge("Bearer service=x"), None);
    }

    #[test]
    fn auth_field_fills_username_and_password() {
        let creds = Credentials::from_parts("", "", &BASE64.encode("me:s3:cret"), "", "").unwrap();
        assert_eq!(creds.username, "me");
        assert_eq!(creds.password, "s3:cret");
        assert_eq!(
            creds.basic_header().unwrap(),
            format!("Basic {}", BASE64.encode("me:s3:cret"))
        );
        assert!(Credentials::from_parts("", "", "!!", "", "").is_err());
        assert!(Credentials::default().is_empty());
        assert!(!format!("{creds:?}").contains("s3:cret"));
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::fuzz_config())]

        #[test]
        fn any_challenge_header_parses_or_is_none(header in "\\PC{0,200}") {
            let _ = parse_challenge(&header);
        }

        #[test]
        fn bearer_challenges_with_any_quoted_values_parse(realm in "[ -!#-~]{0,40}", service in "[ -!#-~]{0,40}") {
            let header = format!("Bearer realm=\"{realm}\",service=\"{service}\"");
            let _ = parse_challenge(&header);
        }
    }
}
