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

/// [`error_chain`], cut to its last `max` bytes (at a character boundary) behind an ellipsis.
pub fn error_chain_tail(e: &dyn std::error::Error, max: usize) -> String {
    let s = error_chain(e);
    if s.len() <= max {
        return s;
    }
    let mut cut = s.len() - max;
    while !s.is_char_boundary(cut) {
        cut += 1;
    }
    format!("…{}", &s[cut..])
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct E(&'static str, Option<Box<E>>);
    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn the_chain_is_cut_to_its_end() {
        let e = E("load", Some(Box::new(E("verifier: é refused", None))));
        assert_eq!(error_chain(&e), "load: verifier: é refused");
        assert_eq!(error_chain_tail(&e, 100), "load: verifier: é refused");
        assert_eq!(error_chain_tail(&e, 7), "…refused");
        assert_eq!(error_chain_tail(&e, 10), "…é refused");
        // A cut inside a character (`é` is two bytes) moves to the next boundary.
        assert_eq!(error_chain_tail(&e, 9), "… refused");
    }
}
