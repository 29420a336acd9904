//! Structured logging via tracing. `RUST_LOG` filters; `NODE_MONITOR_LOG_FORMAT=json` switches to
//! JSON lines for log collectors. Logs go to stderr so stdout stays for command output.
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// An error and its causes on one line (`outer: cause: root cause`), for one log field or one
/// message.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("NODE_MONITOR_LOG_FORMAT").is_ok_and(|v| v == "json");
    let registry = tracing_subscriber::registry().with(filter);
    if json {
        registry
            .with(fmt::layer().json().with_writer(std::io::stderr))
            .init();
    } else {
        registry
            .with(fmt::layer().with_writer(std::io::stderr))
            .init();
    }
}
