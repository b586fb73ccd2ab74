//! The HTTP/1.1 client of `palisade top` (the agent's own endpoint) and the Falcosidekick sink:
//! hyper-util's pooled client over rustls, for http:// and https:// URLs. A server is verified
//! against the system's trust roots and an optional CA file; an optional client certificate
//! gives mutual TLS.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{HeaderMap, Method, Request, StatusCode, Uri, header};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::{
    client::legacy::{self, connect::HttpConnector},
    rt::{TokioExecutor, TokioTimer},
};
use rustls::pki_types::{
    CertificateDer, PrivateKeyDer,
    pem::{self, PemObject},
};
use tracing::warn;

/// How long one request may take, connecting included.
const TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection may wait unused for the next request: below Falcosidekick's 60-s idle
/// timeout, so that a request does not go out on a connection the server is closing.
const IDLE: Duration = Duration::from_secs(30);

/// PEM files for https:// URLs.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// CA certificates to trust besides the system's.
    pub ca: Option<PathBuf>,
    /// A certificate chain and its private key, presented for mutual TLS.
    pub identity: Option<(PathBuf, PathBuf)>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}: only http:// and https://HOST[:PORT]/PATH URLs are supported")]
    Url(String),
    #[error("{}: {error}", .path.display())]
    Pem { path: PathBuf, error: pem::Error },
    #[error("{}: {error}", .path.display())]
    Tls { path: PathBuf, error: rustls::Error },
    /// Connecting, the TLS handshake or the exchange failed; shown with its causes, since
    /// hyper-util's own message is only "client error (Connect)".
    #[error("{}", causes(.0))]
    Request(legacy::Error),
    #[error("reading the answer: {0}")]
    Body(hyper::Error),
    #[error("no answer within {} s", TIMEOUT.as_secs())]
    Timeout,
}

/// A server's answer.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

pub struct Client {
    uri: Uri,
    inner: legacy::Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl Client {
    /// A client of `url`, with the system's trust roots alone for an https:// one.
    pub fn new(url: &str) -> Result<Self, ClientError> {
        Self::with_tls(url, &TlsFiles::default())
    }

    /// A client of `url`; for an https:// one, with the CA and client certificate of `files`.
    pub fn with_tls(url: &str, files: &TlsFiles) -> Result<Self, ClientError> {
        let refused = || ClientError::Url(url.to_owned());
        let uri: Uri = url.parse().map_err(|_| refused())?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(refused()),
        };
        if uri.host().is_none() {
            return Err(refused());
        }
        let config = if https {
            tls_config(files)?
        } else {
            // Never used: the connector speaks TLS to https:// URLs only.
            tls_builder()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth()
        };
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_or_http()
            .enable_http1()
            .build();
        let inner = legacy::Client::builder(TokioExecutor::new())
            .pool_idle_timeout(IDLE)
            // Without a timer the idle timeout is not enforced.
            .pool_timer(TokioTimer::new())
            .pool_max_idle_per_host(1)
            .build(connector);
        Ok(Self { uri, inner })
    }

    pub fn url(&self) -> &Uri {
        &self.uri
    }

    /// GETs the URL.
    pub async fn get(&self) -> Result<Answer, ClientError> {
        self.send(Method::GET, None).await
    }

    /// POSTs `body` (JSON) to the URL.
    pub async fn post_json(&self, body: Bytes) -> Result<Answer, ClientError> {
        self.send(Method::POST, Some(body)).await
    }

    async fn send(&self, method: Method, body: Option<Bytes>) -> Result<Answer, ClientError> {
        tokio::time::timeout(TIMEOUT, self.exchange(method, body))
            .await
            .unwrap_or(Err(ClientError::Timeout))
    }

    async fn exchange(&self, method: Method, body: Option<Bytes>) -> Result<Answer, ClientError> {
        let mut request = Request::builder().method(method).uri(self.uri.clone());
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(body.unwrap_or_default()))
            .expect("a valid request");
        let response = self
            .inner
            .request(request)
            .await
            .map_err(ClientError::Request)?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map_err(ClientError::Body)?.to_bytes();
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }
}

/// rustls with ring, the provider kube uses too, named rather than taken from the process.
fn tls_builder() -> rustls::ConfigBuilder<rustls::ClientConfig, rustls::WantsVerifier> {
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports TLS 1.2 and 1.3")
}

/// Trusts the system's roots and those in `files.ca`; presents `files.identity`.
fn tls_config(files: &TlsFiles) -> Result<rustls::ClientConfig, ClientError> {
    let mut roots = rustls::RootCertStore::empty();
    // Where the system has none (the agent's image), only the CA file is trusted.
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    if let Some(path) = &files.ca {
        for cert in read_certificates(path)? {
            roots.add(cert).map_err(|error| ClientError::Tls {
                path: path.clone(),
                error,
            })?;
        }
    }
    if roots.is_empty() {
        warn!(
            "no trust roots for https:// (the system has none and no CA file is given): every \
             server will be refused"
        );
    }
    let builder = tls_builder().with_root_certificates(roots);
    Ok(match &files.identity {
        Some((cert, key)) => {
            let chain = read_certificates(cert)?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|error| ClientError::Pem {
                path: key.clone(),
                error,
            })?;
            // Refuses a key that is not the certificate's.
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|error| ClientError::Tls {
                    path: cert.clone(),
                    error,
                })?
        }
        None => builder.with_no_client_auth(),
    })
}

/// The certificates of a PEM file: at least one.
fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, ClientError> {
    let failed = |error| ClientError::Pem {
        path: path.to_owned(),
        error,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(failed)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(failed)?;
    if certs.is_empty() {
        return Err(failed(pem::Error::NoItemsFound));
    }
    Ok(certs)
}

/// An error and its causes: "a: b: c".
fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

/// How long a server asks to wait before the next try (`Retry-After`, in seconds or as an
/// HTTP date; a date past is no wait).
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    match value.parse::<u64>() {
        Ok(seconds) => Some(Duration::from_secs(seconds)),
        Err(_) => httpdate::parse_http_date(value)
            .ok()
            .map(|at| at.duration_since(now).unwrap_or(Duration::ZERO)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_and_https_urls_are_accepted() {
        for url in [
            "http://127.0.0.1:2801/",
            "http://sidekick",
            "https://sidekick:2801/",
        ] {
            assert!(Client::new(url).is_ok(), "{url}");
        }
        for url in ["ftp://sidekick/", "sidekick:2801", "not a url"] {
            assert!(
                matches!(Client::new(url), Err(ClientError::Url(_))),
                "{url}"
            );
        }
    }

    #[test]
    fn retry_after_takes_seconds_or_a_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let asked = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::RETRY_AFTER, value.parse().unwrap());
            retry_after(&headers, now)
        };
        assert_eq!(asked("7"), Some(Duration::from_secs(7)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(asked(&later), Some(Duration::from_secs(30)));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(asked(&earlier), Some(Duration::ZERO));
        assert_eq!(asked("soon"), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }
}
