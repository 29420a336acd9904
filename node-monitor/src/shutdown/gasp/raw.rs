//! The last gasp's raw connection: one HTTP/1.1 connection over TLS to the API server, kept
//! established, on which the gasp is one `write(2)`.
use std::sync::Arc;

use super::*;

/// The gasp's own HTTP/1.1 connection over TLS, established ahead of time: on the event the
/// request is encrypted and written with one `write(2)`, with no HTTP client stack in between.
/// Used when the API credentials are static (a bearer token, a token file or a client
/// certificate); with an exec plugin or an auth provider the kube client sends the gasp.
pub(super) struct RawConn {
    tls: rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>,
}

/// How the raw connection reaches and authenticates to the API server.
pub(super) struct RawTarget {
    pub(super) addr: String,
    server_name: rustls::pki_types::ServerName<'static>,
    tls: Arc<rustls::ClientConfig>,
    pub(super) host: String,
    token: Option<String>,
    /// Re-read at every warm-up: projected service account tokens rotate.
    token_file: Option<String>,
    timeout: Duration,
}

impl RawTarget {
    /// `None` when the credentials are not static or the URL is not `https://host[:port]`.
    pub(super) fn new(config: &kube::Config, timeout: Duration) -> Result<Option<Self>, String> {
        use kube::client::ConfigExt as _;
        use secrecy::ExposeSecret as _;
        let auth = &config.auth_info;
        if auth.exec.is_some() || auth.auth_provider.is_some() || auth.username.is_some() {
            return Ok(None);
        }
        let url = &config.cluster_url;
        if url.scheme_str() != Some("https") {
            return Ok(None);
        }
        let Some(host) = url.host() else {
            return Ok(None);
        };
        let port = url.port_u16().unwrap_or(443);
        let token = match (&auth.token, &auth.token_file) {
            (Some(t), _) => Some(t.expose_secret().to_owned()),
            (None, Some(f)) => Some(
                std::fs::read_to_string(f)
                    .map_err(|e| format!("token file {f}: {e}"))?
                    .trim()
                    .to_owned(),
            ),
            (None, None) => None,
        };
        let mut tls = config
            .rustls_client_config()
            .map_err(|e| format!("TLS configuration: {e}"))?;
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = config
            .tls_server_name
            .clone()
            .unwrap_or_else(|| host.trim_matches(['[', ']']).to_owned());
        let server_name = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|e| format!("server name {name}: {e}"))?;
        let host_header = match url.port_u16() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_owned(),
        };
        Ok(Some(Self {
            addr: format!("{}:{port}", host.trim_matches(['[', ']'])),
            server_name,
            tls: Arc::new(tls),
            host: host_header,
            token,
            token_file: if auth.token.is_none() {
                auth.token_file.clone()
            } else {
                None
            },
            timeout,
        }))
    }

    /// Reads the token file again (a failed read keeps the token it has).
    pub(super) fn refresh_token(&mut self) {
        if let Some(f) = &self.token_file
            && let Ok(t) = std::fs::read_to_string(f)
        {
            self.token = Some(t.trim().to_owned());
        }
    }

    /// The request's bytes: the head built here, around `body`.
    pub(super) fn request(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: &str,
    ) -> Vec<u8> {
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: node-monitor-last-gasp\r\nAccept: application/json\r\n",
            self.host
        );
        if let Some(t) = &self.token {
            head.push_str("Authorization: Bearer ");
            head.push_str(t);
            head.push_str("\r\n");
        }
        if let Some(ct) = content_type {
            head.push_str("Content-Type: ");
            head.push_str(ct);
            head.push_str("\r\n");
        }
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        let mut out = head.into_bytes();
        out.extend_from_slice(body.as_bytes());
        out
    }

    /// A new connection, its TLS handshake done by a first `GET /version`.
    pub(super) fn connect(&self) -> std::io::Result<RawConn> {
        self.connect_within(self.timeout)
    }

    /// [`RawTarget::connect`], the connection, the handshake and the first answer each bounded
    /// by `bound` (at most the target's timeout); the connection keeps the target's timeout after.
    pub(super) fn connect_within(&self, bound: Duration) -> std::io::Result<RawConn> {
        let bound = bound.min(self.timeout);
        use std::net::ToSocketAddrs as _;
        let addr = self
            .addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("{}: no address", self.addr)))?;
        let sock = std::net::TcpStream::connect_timeout(&addr, bound)?;
        sock.set_nodelay(true)?;
        let conn = rustls::ClientConnection::new(self.tls.clone(), self.server_name.clone())
            .map_err(std::io::Error::other)?;
        let mut c = RawConn {
            tls: rustls::StreamOwned::new(conn, sock),
        };
        let (status, _) = c.exchange_within(&self.request("GET", "/version", None, ""), bound)?;
        if !(200..300).contains(&status) {
            return Err(std::io::Error::other(format!(
                "GET /version: HTTP {status}"
            )));
        }
        c.set_timeout(self.timeout)?;
        Ok(c)
    }
}

impl RawConn {
    /// The socket's read and write timeouts.
    fn set_timeout(&self, timeout: Duration) -> std::io::Result<()> {
        self.tls.sock.set_read_timeout(Some(timeout))?;
        self.tls.sock.set_write_timeout(Some(timeout))
    }

    /// [`RawConn::exchange`] with each read and write bounded by `bound`, the socket's timeouts
    /// put back after.
    pub(super) fn exchange_within(
        &mut self,
        request: &[u8],
        bound: Duration,
    ) -> std::io::Result<(u16, bool)> {
        let before = self.tls.sock.read_timeout()?;
        self.set_timeout(bound)?;
        let answer = self.exchange(request);
        if let Some(t) = before {
            self.set_timeout(t)?;
        }
        answer
    }

    /// Writes `request` (one TLS record, one write) and reads the answer; its HTTP status.
    pub(super) fn exchange(&mut self, request: &[u8]) -> std::io::Result<(u16, bool)> {
        use std::io::{Read as _, Write as _};
        self.tls.conn.writer().write_all(request)?;
        while self.tls.conn.wants_write() {
            self.tls.conn.write_tls(&mut self.tls.sock)?;
        }
        // The head, then the body by Content-Length (a chunked body ends the connection's use:
        // the caller reconnects).
        let mut buf = Vec::with_capacity(4096);
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = self.tls.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u16>().ok())
            .ok_or_else(|| std::io::Error::other("malformed HTTP answer"))?;
        let length = head.lines().find_map(|l| {
            l.strip_prefix("content-length:")
                .and_then(|v| v.trim().parse::<usize>().ok())
        });
        let Some(length) = length else {
            return Ok((status, false));
        };
        while buf.len() < head_end + length {
            let n = self.tls.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok((status, true))
    }
}
