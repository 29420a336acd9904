//! The node API's large answers (explain, trace, flight) one at a time. Each is a JSON document
//! of up to a few MiB (the flight answer carries up to 16 frozen records of 170 samples), built as
//! a tree and then as text: left to the connection cap alone, 32 callers reading slowly could hold
//! 32 of them at once, far past the agent's memory limit. A permit is taken before an answer is
//! built and released when its last byte has been handed to the connection (or the connection
//! went), so the agent holds at most [`ANSWERS_AT_ONCE`] of them; other callers wait for theirs.
use std::{convert::Infallible, sync::Arc};

use axum::{
    body::{Body, Bytes},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How many large answers the agent builds and sends at once.
pub const ANSWERS_AT_ONCE: usize = 1;
/// The body's chunk size: the connection asks for the next chunk as it drains the last.
const CHUNK: usize = 64 * 1024;

/// The permits of the large answers.
#[derive(Clone)]
pub struct AnswerGate(Arc<Semaphore>);

impl Default for AnswerGate {
    fn default() -> Self {
        Self::new(ANSWERS_AT_ONCE)
    }
}

impl AnswerGate {
    pub fn new(at_once: usize) -> Self {
        Self(Arc::new(Semaphore::new(at_once.max(1))))
    }

    /// Waits for a permit (the gate is never closed).
    pub async fn enter(&self) -> Option<OwnedSemaphorePermit> {
        self.0.clone().acquire_owned().await.ok()
    }

    /// Permits free now.
    pub fn available(&self) -> usize {
        self.0.available_permits()
    }
}

/// `body` as a JSON answer whose text holds `permit` until it has been sent.
pub fn json_answer(
    code: StatusCode,
    body: &Value,
    permit: Option<OwnedSemaphorePermit>,
) -> Response {
    let text = Bytes::from(body.to_string());
    let chunks = futures::stream::unfold((text, permit), |(mut rest, permit)| async move {
        if rest.is_empty() {
            // The permit goes with the state, here or when the connection drops the body.
            drop(permit);
            return None;
        }
        let chunk = rest.split_to(rest.len().min(CHUNK));
        Some((Ok::<_, Infallible>(chunk), (rest, permit)))
    });
    (
        code,
        [("content-type", "application/json")],
        Body::from_stream(chunks),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    #[tokio::test]
    async fn the_permit_is_held_until_the_answer_is_read() {
        let gate = AnswerGate::new(1);
        let big: Value = Value::String("x".repeat(3 * CHUNK + 5));
        let permit = gate.enter().await;
        let response = json_answer(StatusCode::OK, &big, permit);
        assert_eq!(gate.available(), 0, "held while the answer is unread");
        let mut body = response.into_body();
        let first = body.frame().await.expect("a frame").expect("data");
        assert_eq!(first.into_data().expect("data").len(), CHUNK);
        assert_eq!(gate.available(), 0, "held while the rest is unsent");
        let mut rest = 0;
        while let Some(frame) = body.frame().await {
            rest += frame.expect("data").into_data().expect("data").len();
        }
        assert_eq!(rest, big.to_string().len() - CHUNK, "every byte sent");
        assert_eq!(gate.available(), 1, "released once sent");
    }

    #[tokio::test]
    async fn a_dropped_connection_releases_the_permit() {
        let gate = AnswerGate::new(1);
        let permit = gate.enter().await;
        let response = json_answer(
            StatusCode::OK,
            &Value::String("x".repeat(CHUNK * 2)),
            permit,
        );
        assert_eq!(gate.available(), 0);
        drop(response);
        assert_eq!(gate.available(), 1);
    }

    #[tokio::test]
    async fn a_second_caller_waits_for_the_first_answer() {
        let gate = AnswerGate::new(1);
        let first = json_answer(StatusCode::OK, &Value::Null, gate.enter().await);
        let waiting = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.enter().await.is_some() })
        };
        tokio::task::yield_now().await;
        assert!(
            !waiting.is_finished(),
            "the second waits while the first is unsent"
        );
        let _ = first.into_body().collect().await.expect("body");
        assert!(waiting.await.expect("task"), "then it gets its permit");
    }
}
