//! A small HTTP/1.1 client over plain TCP, keeping its connection between requests: enough for
//! `palisade top` (the agent's own endpoint) and the Falcosidekick sink (a service next to the
//! agent). No TLS.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode, Uri, client::conn::http1, header};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tracing::debug;

/// How long one request may take, connecting included.
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}: only http://HOST[:PORT]/PATH URLs are supported")]
    Url(String),
    #[error("connecting to {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("no answer within {} s", TIMEOUT.as_secs())]
    Timeout,
}

pub struct Client {
    uri: Uri,
    /// host:port
    authority: String,
    connection: Option<http1::SendRequest<Full<Bytes>>>,
}

impl Client {
    pub fn new(url: &str) -> Result<Self, ClientError> {
        let uri: Uri = url.parse().map_err(|_| ClientError::Url(url.to_owned()))?;
        if uri.scheme_str() != Some("http") {
            return Err(ClientError::Url(url.to_owned()));
        }
        let host = uri.host().ok_or_else(|| ClientError::Url(url.to_owned()))?;
        let authority = format!("{host}:{}", uri.port_u16().unwrap_or(80));
        Ok(Self {
            uri,
            authority,
            connection: None,
        })
    }

    pub fn url(&self) -> &Uri {
        &self.uri
    }

    /// GET the URL: (status, body).
    pub async fn get(&mut self) -> Result<(StatusCode, Bytes), ClientError> {
        self.send(Method::GET, None).await
    }

    /// POST `body` (JSON) to the URL: (status, body).
    pub async fn post_json(&mut self, body: Bytes) -> Result<(StatusCode, Bytes), ClientError> {
        self.send(Method::POST, Some(body)).await
    }

    async fn send(
        &mut self,
        method: Method,
        body: Option<Bytes>,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let result = tokio::time::timeout(TIMEOUT, self.exchange(method, body))
            .await
            .unwrap_or(Err(ClientError::Timeout));
        if result.is_err() {
            // Start afresh next time.
            self.connection = None;
        }
        result
    }

    async fn exchange(
        &mut self,
        method: Method,
        body: Option<Bytes>,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let connection = match self.connection.take() {
            Some(connection) if !connection.is_closed() => connection,
            _ => self.connect().await?,
        };
        let connection = self.connection.insert(connection);
        connection.ready().await?;
        let mut request = Request::builder()
            .method(method)
            .uri(self.uri.path_and_query().map_or("/", |path| path.as_str()))
            .header(header::HOST, &self.authority);
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(body.unwrap_or_default()))
            .expect("a valid request");
        let response = connection.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }

    async fn connect(&self) -> Result<http1::SendRequest<Full<Bytes>>, ClientError> {
        let stream = TcpStream::connect(&self.authority)
            .await
            .map_err(|err| ClientError::Connect(self.authority.clone(), err))?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                debug!("HTTP client connection: {err}");
            }
        });
        Ok(sender)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_urls_are_accepted() {
        assert!(Client::new("http://127.0.0.1:2801/").is_ok());
        assert_eq!(
            Client::new("http://sidekick").unwrap().authority,
            "sidekick:80"
        );
        for url in ["https://sidekick:2801/", "sidekick:2801", "not a url"] {
            assert!(
                matches!(Client::new(url), Err(ClientError::Url(_))),
                "{url}"
            );
        }
    }
}
