//! `kubectl node-monitor status`'s fleet summary: what holds on every node, read from the nodes'
//! `node-monitor.io/guarantees` annotations (the agents are not asked; listing nodes is enough)
//! and summed up by `node_monitor_core::guarantees::fleet_summary`.
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client, api::ListParams};
use serde_json::{Value, json};

use node_monitor_core::{
    contract::names::GUARANTEES_ANNOTATION,
    guarantees::{decode, fleet_summary, to_json},
};

/// Nodes listed per page.
const PAGE: u32 = 500;

/// Each node's name and guarantees annotation, every page of the list.
pub async fn annotations(client: &Client) -> anyhow::Result<Vec<(String, Option<String>)>> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = nodes.list_metadata(&params).await?;
        out.extend(page.items.into_iter().map(|n| {
            let annotation = n
                .metadata
                .annotations
                .and_then(|mut a| a.remove(GUARANTEES_ANNOTATION));
            (n.metadata.name.unwrap_or_default(), annotation)
        }));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(out),
        }
    }
}

/// The summary's lines.
pub fn text(nodes: &[(String, Option<String>)]) -> String {
    fleet_summary(nodes)
        .into_iter()
        .map(|l| format!("fleet: {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The summary and each node's verdicts (`null`: none published, or unreadable).
pub fn json(nodes: &[(String, Option<String>)]) -> Value {
    let per_node: serde_json::Map<String, Value> = nodes
        .iter()
        .map(|(name, a)| {
            let v = a
                .as_deref()
                .and_then(|a| decode(a).ok())
                .map_or(Value::Null, |d| to_json(&d));
            (name.clone(), v)
        })
        .collect();
    json!({
        "nodes": nodes.len(),
        "summary": fleet_summary(nodes),
        "guarantees": per_node,
    })
}
