//! Single-use tokens that stand for a stored stream request.
//!
//! `Exec`, `Attach` and `PortForward` store their request here and hand the client a URL
//! carrying the token; the stream server takes the request back out exactly once. Tokens
//! are 8 characters of URL-safe base64 from a CSPRNG and expire after a minute; at most
//! [`MAX_OUTSTANDING`] may wait at once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use rand::RngCore;

pub const TOKEN_TTL: Duration = Duration::from_secs(60);
pub const MAX_OUTSTANDING: usize = 1000;
/// 6 random bytes are exactly 8 base64 characters, with no padding.
const TOKEN_BYTES: usize = 6;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("too many stream requests are waiting to be used ({MAX_OUTSTANDING}); try again later")]
    Exhausted,
}

/// Requests waiting for their client, by token.
pub struct TokenCache<T> {
    ttl: Duration,
    entries: Mutex<HashMap<String, (Instant, T)>>,
}

impl<T> Default for TokenCache<T> {
    fn default() -> Self {
        Self::new(TOKEN_TTL)
    }
}

impl<T> TokenCache<T> {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// Stores `request` and returns its token.
    pub fn insert(&self, request: T) -> Result<String, TokenError> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        entries.retain(|_, (expires, _)| *expires > now);
        if entries.len() >= MAX_OUTSTANDING {
            return Err(TokenError::Exhausted);
        }
        loop {
            let token = new_token();
            if !entries.contains_key(&token) {
                entries.insert(token.clone(), (now + self.ttl, request));
                return Ok(token);
            }
        }
    }

    /// Takes the request for `token` out, unless it is unknown, used or expired.
    pub fn take(&self, token: &str) -> Option<T> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (expires, request) = entries.remove(token)?;
        (expires > Instant::now()).then_some(request)
    }

    /// Requests still waiting (expired ones included until the next insert).
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn new_token() -> String {
    let mut bytes = [0u8; TOKEN_BYTES];
    // The thread RNG is a CSPRNG seeded (and reseeded) from the OS.
    rand::rng().fill_bytes(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_eight_url_safe_characters_and_works_once() {
        let cache = TokenCache::default();
        let token = cache.insert(7).unwrap();
        assert_eq!(token.len(), 8);
        assert!(
            token
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "{token}"
        );
        assert_eq!(cache.take(&token), Some(7));
        assert_eq!(cache.take(&token), None);
        assert_eq!(cache.take("unknown!"), None);
    }

    #[test]
    fn expired_tokens_are_refused_and_purged() {
        let cache = TokenCache::new(Duration::from_millis(20));
        let token = cache.insert(1).unwrap();
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(cache.take(&token), None);
        cache.insert(2).unwrap();
        std::thread::sleep(Duration::from_millis(40));
        cache.insert(3).unwrap();
        assert_eq!(cache.len(), 1, "the expired request was purged");
    }

    #[test]
    fn at_most_a_thousand_requests_wait() {
        let cache = TokenCache::default();
        let tokens: Vec<String> = (0..MAX_OUTSTANDING)
            .map(|i| cache.insert(i).unwrap())
            .collect();
        assert_eq!(cache.insert(0), Err(TokenError::Exhausted));
        cache.take(&tokens[0]).unwrap();
        cache.insert(0).unwrap();
    }
}
