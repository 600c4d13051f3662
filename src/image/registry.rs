//! A registry (OCI distribution API) client for pulls: resolve a reference to its top
//! descriptor, fetch manifests, stream blobs. It tries the configured endpoints in order
//! (mirrors, then upstream), answers Basic and Bearer challenges (with username/password,
//! an identity token, or a registry token) and reports which host failed and why.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, WWW_AUTHENTICATE};

use super::auth::{Challenge, Credentials, parse_challenge};
use super::hosts::RegistryEndpoint;
use crate::imagespec::manifest::{MANIFEST_ACCEPT, sha256_digest};
use crate::imagespec::reference::Reference;

/// Manifests larger than this are refused (they are JSON documents of a few KiB).
const MAX_MANIFEST_SIZE: usize = 8 * 1024 * 1024;
/// The largest token endpoint answer crius reads.
const MAX_TOKEN_BODY: usize = 1024 * 1024;
/// How much of an error body crius reads for the message it shows.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Reads a body of at most `limit` bytes, whatever Content-Length says (or does not: a
/// chunked body is counted as it comes). `Ok(None)` when it is longer.
async fn read_limited(
    mut resp: reqwest::Response,
    limit: usize,
) -> Result<Option<Bytes>, reqwest::Error> {
    if resp.content_length().is_some_and(|len| len > limit as u64) {
        return Ok(None);
    }
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = resp.chunk().await? {
        if body.len() + chunk.len() > limit {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body.freeze()))
}

/// The first `limit` bytes of a body; the rest is not read.
async fn read_prefix(mut resp: reqwest::Response, limit: usize) -> Bytes {
    let mut body = bytes::BytesMut::new();
    while body.len() < limit {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                let room = limit - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            _ => break,
        }
    }
    body.freeze()
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{url}: not found (404)")]
    NotFound { url: String },
    #[error("{host}: authentication failed ({status}){}", detail_suffix(.detail))]
    Unauthorized {
        host: String,
        status: u16,
        detail: String,
    },
    #[error("{host}: unreachable: {reason}")]
    Unreachable { host: String, reason: String },
    #[error("{url}: unexpected HTTP status {status}{}", detail_suffix(.detail))]
    Http {
        url: String,
        status: u16,
        detail: String,
    },
    #[error("{what} {digest}: digest mismatch, the content has {actual}")]
    DigestMismatch {
        what: &'static str,
        digest: String,
        actual: String,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("{}", join_errors(.0))]
    AllEndpointsFailed(Vec<RegistryError>),
}

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    }
}

fn join_errors(errors: &[RegistryError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl RegistryError {
    /// The most telling error of several: a definite answer beats an unreachable host.
    pub fn kind(&self) -> &RegistryError {
        match self {
            Self::AllEndpointsFailed(errors) => errors
                .iter()
                .find(|e| matches!(e, Self::Unauthorized { .. }))
                .or_else(|| errors.iter().find(|e| matches!(e, Self::NotFound { .. })))
                .or(errors.last())
                .map(RegistryError::kind)
                .unwrap_or(self),
            other => other,
        }
    }
}

/// A resolved reference: the top-level descriptor and its bytes.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub media_type: String,
    pub digest: String,
    pub data: Bytes,
    /// The endpoint that answered; fetches try it first.
    pub endpoint: usize,
}

/// HTTP clients by TLS settings, shared by all pulls.
#[derive(Default)]
pub struct HttpClients {
    clients: Mutex<HashMap<String, reqwest::Client>>,
}

impl HttpClients {
    fn for_endpoint(&self, ep: &RegistryEndpoint) -> Result<reqwest::Client, RegistryError> {
        let key = format!("{}|{:?}|{:?}", ep.skip_verify, ep.ca, ep.client);
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(client) = clients.get(&key) {
            return Ok(client.clone());
        }
        let client = build_client(ep)?;
        clients.insert(key, client.clone());
        Ok(client)
    }
}

fn build_client(ep: &RegistryEndpoint) -> Result<reqwest::Client, RegistryError> {
    let invalid = |what: String| RegistryError::Invalid(format!("{}: {what}", ep.base));
    let mut builder = reqwest::Client::builder()
        .user_agent(concat!("crius/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(Duration::from_secs(30))
        .pool_idle_timeout(Duration::from_secs(90))
        .redirect(redirect_policy())
        .danger_accept_invalid_certs(ep.skip_verify);
    for ca in &ep.ca {
        let pem = std::fs::read(ca).map_err(|e| invalid(format!("CA {}: {e}", ca.display())))?;
        for cert in reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| invalid(format!("CA {}: {e}", ca.display())))?
        {
            builder = builder.add_root_certificate(cert);
        }
    }
    if let Some((cert, key)) = ep.client.first() {
        let mut pem = std::fs::read(cert)
            .map_err(|e| invalid(format!("client certificate {}: {e}", cert.display())))?;
        if let Some(key) = key {
            pem.extend(
                std::fs::read(key)
                    .map_err(|e| invalid(format!("client key {}: {e}", key.display())))?,
            );
        }
        let identity = reqwest::Identity::from_pem(&pem)
            .map_err(|e| invalid(format!("client certificate {}: {e}", cert.display())))?;
        builder = builder.identity(identity);
    }
    builder.build().map_err(|e| invalid(e.to_string()))
}

/// Most redirects one request follows (blob downloads go to a CDN once or twice).
const MAX_REDIRECTS: usize = 5;

/// Redirects a registry may send crius on: a few, never from https down to plain http (its
/// Authorization would go in clear text on the same host), never to a link-local address
/// (a cloud's metadata service, from the node's network).
fn redirect_policy() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        if attempt.previous().len() > MAX_REDIRECTS {
            return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
        }
        let from_https = attempt
            .previous()
            .last()
            .is_some_and(|url| url.scheme() == "https");
        if let Err(why) = allowed_target(attempt.url(), from_https) {
            return attempt.error(why);
        }
        attempt.follow()
    })
}

/// Whether crius may send a request a registry pointed it to (a redirect or a token
/// realm), having come from https or not.
fn allowed_target(url: &reqwest::Url, from_https: bool) -> Result<(), String> {
    if from_https && url.scheme() != "https" {
        return Err(format!("{url} would leave https for plain http"));
    }
    let host = url.host_str().unwrap_or_default();
    let ip = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>();
    let link_local = match ip {
        Ok(std::net::IpAddr::V4(ip)) => ip.is_link_local(),
        Ok(std::net::IpAddr::V6(ip)) => ip.segments()[0] & 0xffc0 == 0xfe80,
        Err(_) => false,
    };
    if link_local {
        return Err(format!("{url} is a link-local address"));
    }
    Ok(())
}

/// One pull's conversation with a registry: endpoints, credentials and tokens.
pub struct Session {
    reference: Reference,
    endpoints: Vec<(RegistryEndpoint, reqwest::Client)>,
    /// Credentials per endpoint host; `fallback` applies to every host.
    credentials: HashMap<String, Credentials>,
    fallback: Option<Credentials>,
    /// The Authorization header that worked, per endpoint base.
    authorization: Mutex<HashMap<String, String>>,
}

impl Session {
    pub fn new(
        clients: &HttpClients,
        reference: Reference,
        endpoints: Vec<RegistryEndpoint>,
        credentials: HashMap<String, Credentials>,
        fallback: Option<Credentials>,
    ) -> Result<Arc<Self>, RegistryError> {
        let endpoints = endpoints
            .into_iter()
            .map(|ep| clients.for_endpoint(&ep).map(|c| (ep, c)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(Self {
            reference,
            endpoints,
            credentials,
            fallback,
            authorization: Mutex::new(HashMap::new()),
        }))
    }

    /// Resolves the reference on the first endpoint that can, returning the manifest or
    /// index it names.
    pub async fn resolve(&self) -> Result<Resolved, RegistryError> {
        let object = self.reference.object().to_string();
        let mut errors = Vec::new();
        for (i, (ep, _)) in self.endpoints.iter().enumerate() {
            if !ep.capabilities.resolve {
                continue;
            }
            match self.get_manifest(i, &object).await {
                Ok((media_type, data)) => {
                    let digest = sha256_digest(&data);
                    if let Some(expected) = &self.reference.digest
                        && expected != &digest
                    {
                        return Err(RegistryError::DigestMismatch {
                            what: "manifest",
                            digest: expected.clone(),
                            actual: digest,
                        });
                    }
                    return Ok(Resolved {
                        media_type,
                        digest,
                        data,
                        endpoint: i,
                    });
                }
                Err(e) => {
                    tracing::debug!(endpoint = %ep.base, error = %e, "resolve failed on endpoint");
                    errors.push(e);
                }
            }
        }
        Err(collapse(errors, "resolve"))
    }

    /// Fetches the manifest `digest`, checking the content against it.
    pub async fn fetch_manifest(
        &self,
        first: usize,
        digest: &str,
    ) -> Result<(String, Bytes), RegistryError> {
        let mut errors = Vec::new();
        for i in self.pull_order(first) {
            match self.get_manifest(i, digest).await {
                Ok((media_type, data)) => {
                    let actual = sha256_digest(&data);
                    if actual != digest {
                        return Err(RegistryError::DigestMismatch {
                            what: "manifest",
                            digest: digest.to_string(),
                            actual,
                        });
                    }
                    return Ok((media_type, data));
                }
                Err(e) => errors.push(e),
            }
        }
        Err(collapse(errors, "pull"))
    }

    /// Opens the blob `digest` as a byte stream. The caller checks the digest.
    pub async fn fetch_blob(
        &self,
        first: usize,
        digest: &str,
    ) -> Result<impl Stream<Item = Result<Bytes, RegistryError>> + use<>, RegistryError> {
        let mut errors = Vec::new();
        for i in self.pull_order(first) {
            let path = format!("/blobs/{digest}");
            match self.get(i, &path, None).await {
                Ok(resp) => {
                    let host = self.endpoints[i].0.host().to_string();
                    return Ok(resp.bytes_stream().map(move |chunk| {
                        chunk.map_err(|e| RegistryError::Unreachable {
                            host: host.clone(),
                            reason: format!("reading blob: {}", error_chain(&e)),
                        })
                    }));
                }
                Err(e) => errors.push(e),
            }
        }
        Err(collapse(errors, "pull"))
    }

    /// Endpoints that may pull, starting with `first`.
    fn pull_order(&self, first: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.endpoints.len())
            .filter(|&i| self.endpoints[i].0.capabilities.pull)
            .collect();
        if let Some(pos) = order.iter().position(|&i| i == first) {
            order.remove(pos);
            order.insert(0, first);
        }
        order
    }

    async fn get_manifest(&self, i: usize, object: &str) -> Result<(String, Bytes), RegistryError> {
        let path = format!("/manifests/{object}");
        let resp = self.get(i, &path, Some(MANIFEST_ACCEPT)).await?;
        let url = resp.url().to_string();
        let media_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or(v).trim().to_string())
            .unwrap_or_default();
        let data = read_limited(resp, MAX_MANIFEST_SIZE)
            .await
            .map_err(|e| RegistryError::Unreachable {
                host: self.endpoints[i].0.host().to_string(),
                reason: error_chain(&e),
            })?
            .ok_or_else(|| {
                RegistryError::Invalid(format!(
                    "{url}: manifest larger than {MAX_MANIFEST_SIZE} bytes"
                ))
            })?;
        let media_type = if media_type.is_empty() || media_type == "application/json" {
            media_type_from_body(&data)
        } else {
            media_type
        };
        Ok((media_type, data))
    }

    /// A GET on endpoint `i`, answering one authentication challenge.
    async fn get(
        &self,
        i: usize,
        path: &str,
        accept: Option<&str>,
    ) -> Result<reqwest::Response, RegistryError> {
        let (ep, client) = &self.endpoints[i];
        let url = format!(
            "{}{}/{}{path}",
            ep.base, ep.path_prefix, self.reference.path
        );
        let mut retried = false;
        loop {
            let mut req = client.get(&url);
            for (name, value) in &ep.headers {
                req = req.header(name, value);
            }
            if let Some(accept) = accept {
                req = req.header(ACCEPT, accept);
            }
            if let Some(auth) = self.cached_authorization(&ep.base) {
                req = req.header(AUTHORIZATION, auth);
            }
            let resp = req.send().await.map_err(|e| RegistryError::Unreachable {
                host: ep.host().to_string(),
                reason: error_chain(&e),
            })?;
            let status = resp.status();
            if status.is_success() {
                return Ok(resp);
            }
            if status == StatusCode::UNAUTHORIZED && !retried {
                retried = true;
                let header = self.authorize(i, resp.headers()).await?;
                self.authorization
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(ep.base.clone(), header);
                continue;
            }
            let detail = error_detail(resp).await;
            return Err(match status {
                StatusCode::NOT_FOUND => RegistryError::NotFound { url },
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => RegistryError::Unauthorized {
                    host: ep.host().to_string(),
                    status: status.as_u16(),
                    detail,
                },
                _ => RegistryError::Http {
                    url,
                    status: status.as_u16(),
                    detail,
                },
            });
        }
    }

    fn cached_authorization(&self, base: &str) -> Option<String> {
        self.authorization
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(base)
            .cloned()
    }

    /// The credentials for an endpoint: its host's from the config, else the request's, but
    /// those only for the image's own registry, never for a mirror of it on another host.
    fn credentials_for(&self, ep: &RegistryEndpoint) -> Option<&Credentials> {
        self.credentials
            .get(ep.host())
            .or_else(|| {
                self.fallback
                    .as_ref()
                    .filter(|_| is_registry_host(ep.host(), &self.reference.domain))
            })
            .filter(|c| !c.is_empty())
    }

    /// The Authorization header answering a 401's challenge.
    async fn authorize(&self, i: usize, headers: &HeaderMap) -> Result<String, RegistryError> {
        let (ep, client) = &self.endpoints[i];
        let unauthorized = |detail: &str| RegistryError::Unauthorized {
            host: ep.host().to_string(),
            status: 401,
            detail: detail.to_string(),
        };
        let challenge = headers
            .get_all(WWW_AUTHENTICATE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(parse_challenge)
            .ok_or_else(|| unauthorized("no supported authentication challenge"))?;
        let creds = self.credentials_for(ep);
        match challenge {
            Challenge::Basic => creds.and_then(Credentials::basic_header).ok_or_else(|| {
                unauthorized("the registry requires credentials and none were given")
            }),
            Challenge::Bearer {
                realm,
                service,
                scope,
            } => {
                if let Some(c) = creds.filter(|c| !c.registry_token.is_empty()) {
                    return Ok(format!("Bearer {}", c.registry_token));
                }
                let realm_url = reqwest::Url::parse(&realm)
                    .map_err(|e| unauthorized(&format!("token realm {realm:?}: {e}")))?;
                allowed_target(&realm_url, !ep.is_plain_http())
                    .map_err(|why| unauthorized(&format!("token realm: {why}")))?;
                let scope =
                    scope.unwrap_or_else(|| format!("repository:{}:pull", self.reference.path));
                let token = fetch_token(client, &realm, service.as_deref(), &scope, creds)
                    .await
                    .map_err(|e| unauthorized(&format!("token from {realm}: {e}")))?;
                Ok(format!("Bearer {token}"))
            }
        }
    }
}

/// Gets a bearer token: OAuth2 refresh-token grant with an identity token, else a GET with
/// Basic credentials (or anonymously).
async fn fetch_token(
    client: &reqwest::Client,
    realm: &str,
    service: Option<&str>,
    scope: &str,
    creds: Option<&Credentials>,
) -> Result<String, String> {
    #[derive(serde::Deserialize)]
    struct TokenResponse {
        #[serde(default)]
        token: String,
        #[serde(default)]
        access_token: String,
    }
    let service = service.unwrap_or_default();
    let req = match creds.filter(|c| !c.identity_token.is_empty()) {
        Some(c) => client.post(realm).form(&[
            ("grant_type", "refresh_token"),
            ("refresh_token", c.identity_token.as_str()),
            ("service", service),
            ("scope", scope),
            ("client_id", "crius"),
        ]),
        None => {
            let mut req = client
                .get(realm)
                .query(&[("service", service), ("scope", scope)]);
            if let Some(basic) = creds.and_then(Credentials::basic_header) {
                req = req.header(AUTHORIZATION, basic);
            }
            req
        }
    };
    let resp = req.send().await.map_err(|e| error_chain(&e))?;
    if !resp.status().is_success() {
        return Err(format!("HTTP {}", resp.status().as_u16()));
    }
    let bytes = read_limited(resp, MAX_TOKEN_BODY)
        .await
        .map_err(|e| error_chain(&e))?
        .ok_or_else(|| format!("the token response is larger than {MAX_TOKEN_BODY} bytes"))?;
    let body: TokenResponse =
        serde_json::from_slice(&bytes).map_err(|e| format!("malformed token response: {e}"))?;
    let token = if body.access_token.is_empty() {
        body.token
    } else {
        body.access_token
    };
    if token.is_empty() {
        return Err("the token endpoint returned no token".to_string());
    }
    Ok(token)
}

/// Whether an endpoint's host is the registry an image names (Docker Hub answers as
/// `registry-1.docker.io`).
fn is_registry_host(host: &str, domain: &str) -> bool {
    host == domain || (domain == "docker.io" && host == "registry-1.docker.io")
}

fn collapse(mut errors: Vec<RegistryError>, what: &str) -> RegistryError {
    match errors.len() {
        0 => RegistryError::Invalid(format!("no registry host is configured to {what}")),
        1 => errors.remove(0),
        _ => RegistryError::AllEndpointsFailed(errors),
    }
}

/// The registry's error message (its JSON `errors[].message`), shortened.
async fn error_detail(resp: reqwest::Response) -> String {
    let text = String::from_utf8_lossy(&read_prefix(resp, MAX_ERROR_BODY).await).into_owned();
    #[derive(serde::Deserialize)]
    struct Errors {
        errors: Vec<ErrorItem>,
    }
    #[derive(serde::Deserialize)]
    struct ErrorItem {
        #[serde(default)]
        message: String,
    }
    match serde_json::from_str::<Errors>(&text) {
        Ok(e) => e
            .errors
            .into_iter()
            .map(|e| e.message)
            .collect::<Vec<_>>()
            .join("; "),
        Err(_) => text.chars().take(200).collect(),
    }
}

/// A body without a usable Content-Type: tell the document kind by its fields.
fn media_type_from_body(data: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        #[serde(default)]
        media_type: String,
        manifests: Option<serde_json::Value>,
    }
    match serde_json::from_slice::<Probe>(data) {
        Ok(p) if !p.media_type.is_empty() => p.media_type,
        Ok(p) if p.manifests.is_some() => crate::imagespec::manifest::OCI_INDEX.to_string(),
        _ => crate::imagespec::manifest::OCI_MANIFEST.to_string(),
    }
}

/// An error and its sources on one line (reqwest hides the cause in the chain).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text = format!("{text}: {s_text}");
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::hosts::{Capabilities, RegistryEndpoint};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A registry that only answers with a bearer token from its own token endpoint. It
    /// accepts Basic `me:pw` or the refresh token `refresh-me` there, and records requests.
    async fn bearer_registry() -> (String, Arc<Mutex<Vec<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (base, log) = (addr.clone(), seen.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let (base, log) = (base.clone(), log.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let n = conn.read(&mut chunk).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buf).to_string();
                        let Some(head_end) = text.find("\r\n\r\n") else {
                            continue;
                        };
                        let length = text[..head_end]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if buf.len() < head_end + 4 + length {
                            continue;
                        }
                        let request = text[..head_end + 4 + length].to_string();
                        buf.drain(..head_end + 4 + length);
                        log.lock().unwrap().push(request.clone());
                        let first = request.lines().next().unwrap_or_default().to_string();
                        let (status, headers, body) = if first.starts_with("GET /token")
                            || first.starts_with("POST /token")
                        {
                            if request.contains("Basic bWU6cHc=") {
                                (
                                    "200 OK",
                                    String::new(),
                                    r#"{"token":"basic-token"}"#.to_string(),
                                )
                            } else if request.contains("refresh_token=refresh-me") {
                                (
                                    "200 OK",
                                    String::new(),
                                    r#"{"access_token":"oauth-token"}"#.to_string(),
                                )
                            } else {
                                ("401 Unauthorized", String::new(), String::new())
                            }
                        } else if request.contains("Bearer basic-token")
                            || request.contains("Bearer oauth-token")
                        {
                            (
                                "200 OK",
                                format!(
                                    "Content-Type: {}\r\n",
                                    crate::imagespec::manifest::OCI_MANIFEST
                                ),
                                r#"{"config":{"digest":"sha256:c","size":1},"layers":[]}"#
                                    .to_string(),
                            )
                        } else {
                            (
                                "401 Unauthorized",
                                format!(
                                    "WWW-Authenticate: Bearer realm=\"http://{base}/token\",service=\"fake\",scope=\"repository:repo:pull\"\r\n"
                                ),
                                String::new(),
                            )
                        };
                        let reply = format!(
                            "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if conn.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, seen)
    }

    /// A plain-HTTP endpoint at `addr` that pulls and resolves.
    fn plain_endpoint(addr: &str) -> RegistryEndpoint {
        RegistryEndpoint {
            base: format!("http://{addr}"),
            path_prefix: "/v2".into(),
            capabilities: Capabilities {
                pull: true,
                resolve: true,
                push: false,
            },
            skip_verify: false,
            ca: Vec::new(),
            client: Vec::new(),
            headers: Vec::new(),
        }
    }

    fn session(addr: &str, creds: Credentials) -> Arc<Session> {
        let endpoint = RegistryEndpoint {
            headers: vec![("X-Test".into(), "1".into())],
            ..plain_endpoint(addr)
        };
        let reference = Reference::parse(&format!("{addr}/repo:tag")).unwrap();
        Session::new(
            &HttpClients::default(),
            reference,
            vec![endpoint],
            HashMap::new(),
            Some(creds),
        )
        .unwrap()
    }

    #[test]
    fn a_registry_may_not_send_crius_down_to_http_or_to_link_local_addresses() {
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        assert!(allowed_target(&url("https://cdn.example/blob"), true).is_ok());
        assert!(allowed_target(&url("http://127.0.0.1:5000/v2/"), false).is_ok());
        assert!(allowed_target(&url("http://registry.example/token"), true).is_err());
        for target in [
            "http://169.254.169.254/latest/meta-data/",
            "https://169.254.170.2/v2/credentials",
            "http://[fe80::1]/",
        ] {
            let err = allowed_target(&url(target), false).expect_err(target);
            assert!(err.contains("link-local"), "{err}");
        }
    }

    #[tokio::test]
    async fn a_redirect_to_a_link_local_address_is_not_followed() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut head = [0u8; 1024];
                let _ = conn.read(&mut head).await;
                let reply = "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://169.254.169.254/latest/meta-data/\r\nContent-Length: 0\r\n\r\n";
                let _ = conn.write_all(reply.as_bytes()).await;
            }
        });
        let client = build_client(&plain_endpoint(&addr.to_string())).unwrap();
        let err = client
            .get(format!("http://{addr}/v2/repo/blobs/sha256:0"))
            .send()
            .await
            .expect_err("redirected to the metadata service");
        let chain = error_chain(&err);
        assert!(chain.contains("link-local"), "{chain}");
    }

    #[tokio::test]
    async fn bearer_challenge_with_basic_credentials_and_identity_token() {
        let (addr, seen) = bearer_registry().await;
        let basic = Credentials {
            username: "me".into(),
            password: "pw".into(),
            ..Default::default()
        };
        let resolved = session(&addr, basic)
            .resolve()
            .await
            .expect("resolve with a token");
        assert_eq!(
            resolved.media_type,
            crate::imagespec::manifest::OCI_MANIFEST
        );
        let requests = seen.lock().unwrap().clone();
        assert!(
            requests
                .iter()
                .any(|r| r.starts_with("GET /token?service=fake&scope=repository%3Arepo%3Apull")),
            "{requests:?}"
        );
        assert!(
            requests
                .iter()
                .all(|r| !r.starts_with("GET /v2") || r.to_ascii_lowercase().contains("x-test: 1"))
        );

        let oauth = Credentials {
            identity_token: "refresh-me".into(),
            ..Default::default()
        };
        session(&addr, oauth)
            .resolve()
            .await
            .expect("resolve with an identity token");

        let wrong = Credentials {
            username: "me".into(),
            password: "nope".into(),
            ..Default::default()
        };
        let err = session(&addr, wrong)
            .resolve()
            .await
            .expect_err("bad credentials");
        assert!(matches!(err, RegistryError::Unauthorized { .. }), "{err}");
    }

    #[test]
    fn the_most_telling_error_wins() {
        let all = RegistryError::AllEndpointsFailed(vec![
            RegistryError::NotFound {
                url: "http://mirror/v2/a/manifests/x".into(),
            },
            RegistryError::Unreachable {
                host: "upstream".into(),
                reason: "dns".into(),
            },
        ]);
        assert!(matches!(all.kind(), RegistryError::NotFound { .. }));
        let text = all.to_string();
        assert!(
            text.contains("not found") && text.contains("upstream: unreachable"),
            "{text}"
        );
    }

    #[test]
    fn media_type_from_body_probes_fields() {
        assert_eq!(
            media_type_from_body(br#"{"manifests":[]}"#),
            crate::imagespec::manifest::OCI_INDEX
        );
        assert_eq!(
            media_type_from_body(br#"{"mediaType":"x","config":{}}"#),
            "x"
        );
    }
}
