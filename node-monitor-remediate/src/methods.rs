//! Fence configuration in ConfigMaps, named as in the node-fencing design proposal:
//!
//! - `fence-config-<node>` (or `fence-config-default` for every node without one), key
//!   `config.properties`: `isolation=`, `power_management=`, `recovery=` — each a list of method
//!   names run in order — and optionally `node_name=` (must match);
//! - `fence-method-<method>-<node>` (or the shared `fence-method-<method>`), key
//!   `method.properties`: `template=<template ConfigMap>` and parameters overriding the template's.
//!   Method and node names both contain `-`, so a name alone is ambiguous
//!   (`fence-method-eaton-off-host0` is method `eaton-off` of node `host0`, method `eaton` of node
//!   `off-host0`, or the shared method `eaton-off-host0`): a per-node method must say whose it is
//!   with `node_name=<node>` (exact; optionally `method_name=<method>`), a shared one may say
//!   `method_name=<method>`, and a ConfigMap that could be either is refused;
//! - the template ConfigMap (by convention `fence-method-template-<name>`), key
//!   `template.properties`: `agent_name=` (the command: a fence agent such as `fence_ipmilan`, or a
//!   script) and common parameters.
//!
//! A method runs as its agent with every parameter written to its standard input as `name=value`
//! lines — the calling convention of the ClusterLabs fence agents — plus `nodename=<node>` unless
//! set. `$(NODE_NAME)` in a value is replaced by the node's name. `secret=<Secret>` adds that
//! Secret's keys as parameters (credentials stay out of ConfigMaps). `timeout=<duration>` bounds
//! the run. `template`, `agent_name`, `name`, `secret` and `timeout` never reach the agent.
//!
//! Everything here is pure: the ConfigMaps come in as maps, errors name the ConfigMap, the key
//! and the offending line.
use std::{collections::BTreeMap, time::Duration};

use node_monitor_core::{remediation::Step, units::duration::parse_non_negative};

pub const CONFIG_KEY: &str = "config.properties";
pub const METHOD_KEY: &str = "method.properties";
pub const TEMPLATE_KEY: &str = "template.properties";
pub const CONFIG_PREFIX: &str = "fence-config-";
pub const DEFAULT_CONFIG: &str = "fence-config-default";
pub const METHOD_PREFIX: &str = "fence-method-";
/// Replaced by the node's name in parameter values.
pub const NODE_NAME_VAR: &str = "$(NODE_NAME)";
/// Keys that configure node-monitor and never reach the agent.
pub const RESERVED_KEYS: [&str; 7] = [
    "template",
    "agent_name",
    "name",
    "secret",
    "timeout",
    "node_name",
    "method_name",
];
/// In `method.properties`: the exact node a per-node method is for.
pub const NODE_NAME_KEY: &str = "node_name";
/// In `method.properties`: the exact method a ConfigMap defines.
pub const METHOD_NAME_KEY: &str = "method_name";

/// A fence configuration that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceConfigError {
    #[error("ConfigMap {configmap}: missing key {key:?}")]
    MissingKey {
        configmap: String,
        key: &'static str,
    },
    #[error("ConfigMap {configmap} key {key}: line {line}: {text:?} is not name=value")]
    BadLine {
        configmap: String,
        key: &'static str,
        line: usize,
        text: String,
    },
    #[error("ConfigMap {configmap} key {key}: {name}={value:?}: {reason}")]
    Invalid {
        configmap: String,
        key: &'static str,
        name: String,
        value: String,
        reason: &'static str,
    },
    #[error("method {method:?} of node {node}: none of the ConfigMaps {tried:?} exists")]
    MissingMethod {
        method: String,
        node: String,
        tried: Vec<String>,
    },
    #[error(
        "ConfigMap {configmap}: its name could be method {method:?} of node {node:?} or the shared method {shared:?}; add node_name={node} (a per-node method) or method_name={shared} (a shared one)"
    )]
    AmbiguousMethod {
        configmap: String,
        method: String,
        node: String,
        shared: String,
    },
    #[error("method {method:?}: its template ConfigMap {template:?} does not exist")]
    MissingTemplate { method: String, template: String },
    #[error("method {method:?}: no agent_name in {origin}")]
    NoAgent { method: String, origin: String },
}

/// Parses `name=value` lines (`#` and `!` start comments; blank lines are skipped; the first `=`
/// splits; both sides are trimmed).
pub fn parse_properties(
    configmap: &str,
    key: &'static str,
    text: &str,
) -> Result<BTreeMap<String, String>, FenceConfigError> {
    let mut out = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        let bad = || FenceConfigError::BadLine {
            configmap: configmap.to_owned(),
            key,
            line: i + 1,
            text: raw.to_owned(),
        };
        let (name, value) = line.split_once('=').ok_or_else(bad)?;
        let name = name.trim();
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(bad());
        }
        out.insert(name.to_owned(), value.trim().to_owned());
    }
    Ok(out)
}

fn valid_method_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// The methods of each step for one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFencePlan {
    /// The ConfigMap it came from.
    pub source: String,
    pub isolation: Vec<String>,
    pub power_management: Vec<String>,
    pub recovery: Vec<String>,
}

impl NodeFencePlan {
    pub fn methods(&self, step: Step) -> &[String] {
        match step {
            Step::Isolation => &self.isolation,
            Step::PowerManagement => &self.power_management,
            Step::Recovery => &self.recovery,
        }
    }

    pub fn configured(&self) -> node_monitor_core::remediation::ConfiguredSteps {
        node_monitor_core::remediation::ConfiguredSteps {
            isolation: !self.isolation.is_empty(),
            power_management: !self.power_management.is_empty(),
            recovery: !self.recovery.is_empty(),
        }
    }
}

/// The ConfigMap names tried for a node's plan, in order.
pub fn plan_candidates(node: &str) -> [String; 2] {
    [format!("{CONFIG_PREFIX}{node}"), DEFAULT_CONFIG.to_owned()]
}

/// The ConfigMap names tried for a method, in order: the node's own, then the shared one.
pub fn method_candidates(method: &str, node: &str) -> [String; 2] {
    [
        format!("{METHOD_PREFIX}{method}-{node}"),
        format!("{METHOD_PREFIX}{method}"),
    ]
}

/// Reads a node's plan from its ConfigMap data (`configmap` names it in errors).
pub fn parse_plan(
    configmap: &str,
    data: &BTreeMap<String, String>,
    node: &str,
) -> Result<NodeFencePlan, FenceConfigError> {
    let text = data
        .get(CONFIG_KEY)
        .ok_or_else(|| FenceConfigError::MissingKey {
            configmap: configmap.to_owned(),
            key: CONFIG_KEY,
        })?;
    let props = parse_properties(configmap, CONFIG_KEY, text)?;
    let invalid = |name: &str, value: &str, reason| FenceConfigError::Invalid {
        configmap: configmap.to_owned(),
        key: CONFIG_KEY,
        name: name.to_owned(),
        value: value.to_owned(),
        reason,
    };
    let mut plan = NodeFencePlan {
        source: configmap.to_owned(),
        isolation: Vec::new(),
        power_management: Vec::new(),
        recovery: Vec::new(),
    };
    for (name, value) in &props {
        let list = match name.as_str() {
            "node_name" => {
                // The shared default names no node; a per-node one must name its own.
                if configmap != DEFAULT_CONFIG && value != node {
                    return Err(invalid(name, value, "does not match the node"));
                }
                continue;
            }
            "isolation" => &mut plan.isolation,
            "power_management" => &mut plan.power_management,
            "recovery" => &mut plan.recovery,
            _ => {
                return Err(invalid(
                    name,
                    value,
                    "unknown setting (known: node_name, isolation, power_management, recovery)",
                ));
            }
        };
        for m in value.split([' ', ',', '\t']).filter(|m| !m.is_empty()) {
            if !valid_method_name(m) {
                return Err(invalid(
                    name,
                    value,
                    "method names are lower-case letters, digits and '-'",
                ));
            }
            list.push(m.to_owned());
        }
    }
    Ok(plan)
}

/// A method ready to run (before its Secret, if any, is read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodSpec {
    pub method: String,
    pub agent: String,
    /// Parameters for the agent's standard input (reserved keys removed, `$(NODE_NAME)` expanded,
    /// `nodename` added).
    pub params: BTreeMap<String, String>,
    /// A Secret whose keys are added as parameters.
    pub secret: Option<String>,
    pub timeout: Duration,
    /// The ConfigMaps it came from, for messages.
    pub origin: String,
}

/// Resolves method `method` for `node` from the ConfigMaps `get` returns (by name, their data).
pub fn resolve_method<'a>(
    method: &str,
    node: &str,
    default_timeout: Duration,
    get: impl Fn(&str) -> Option<&'a BTreeMap<String, String>>,
) -> Result<MethodSpec, FenceConfigError> {
    let tried = method_candidates(method, node);
    let mut found = None;
    for (i, name) in tried.iter().enumerate() {
        let Some(data) = get(name) else { continue };
        let text = data
            .get(METHOD_KEY)
            .ok_or_else(|| FenceConfigError::MissingKey {
                configmap: name.clone(),
                key: METHOD_KEY,
            })?;
        let props = parse_properties(name, METHOD_KEY, text)?;
        let ours = if i == 0 {
            per_node_method_is_ours(name, &props, method, node)?
        } else {
            shared_method_is_ours(name, &props, method)?
        };
        if ours {
            found = Some((name.clone(), props));
            break;
        }
    }
    let (method_cm, method_props) = found.ok_or_else(|| FenceConfigError::MissingMethod {
        method: method.to_owned(),
        node: node.to_owned(),
        tried: tried.to_vec(),
    })?;
    let mut params = BTreeMap::new();
    let mut origin = method_cm.clone();
    if let Some(template) = method_props.get("template") {
        let data = get(template).ok_or_else(|| FenceConfigError::MissingTemplate {
            method: method.to_owned(),
            template: template.clone(),
        })?;
        let text = data
            .get(TEMPLATE_KEY)
            .ok_or_else(|| FenceConfigError::MissingKey {
                configmap: template.clone(),
                key: TEMPLATE_KEY,
            })?;
        params.extend(parse_properties(template, TEMPLATE_KEY, text)?);
        origin = format!("{method_cm} + {template}");
    }
    params.extend(method_props);
    let agent = params
        .get("agent_name")
        .filter(|a| !a.is_empty())
        .cloned()
        .ok_or_else(|| FenceConfigError::NoAgent {
            method: method.to_owned(),
            origin: origin.clone(),
        })?;
    let timeout = match params.get("timeout") {
        None => default_timeout,
        Some(v) => match parse_non_negative(v) {
            Ok(Some(d)) if !d.is_zero() => d,
            _ => {
                return Err(FenceConfigError::Invalid {
                    configmap: origin,
                    key: METHOD_KEY,
                    name: "timeout".to_owned(),
                    value: v.clone(),
                    reason: "must be a positive duration such as 30s",
                });
            }
        },
    };
    let secret = params.get("secret").filter(|s| !s.is_empty()).cloned();
    let mut agent_params: BTreeMap<String, String> = params
        .into_iter()
        .filter(|(k, _)| !RESERVED_KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k, v.replace(NODE_NAME_VAR, node)))
        .collect();
    agent_params
        .entry("nodename".to_owned())
        .or_insert_with(|| node.to_owned());
    Ok(MethodSpec {
        method: method.to_owned(),
        agent,
        params: agent_params,
        secret,
        timeout,
        origin,
    })
}

fn declared_mismatch(
    configmap: &str,
    key: &'static str,
    value: &str,
    reason: &'static str,
) -> FenceConfigError {
    FenceConfigError::Invalid {
        configmap: configmap.to_owned(),
        key: METHOD_KEY,
        name: key.to_owned(),
        value: value.to_owned(),
        reason,
    }
}

/// Whether `fence-method-<method>-<node>` really is method `method` of node `node`: it must
/// name the node exactly (`node_name`). One naming another node belongs to another split of the
/// same name (method `a` of node `b-c` and method `a-b` of node `c` share it) and is not ours; one
/// naming a different method (`method_name`) with no node is a shared method whose name contains
/// `-`; one naming neither is refused, since which it is cannot be told.
fn per_node_method_is_ours(
    configmap: &str,
    props: &BTreeMap<String, String>,
    method: &str,
    node: &str,
) -> Result<bool, FenceConfigError> {
    let declared_method = props.get(METHOD_NAME_KEY);
    match props.get(NODE_NAME_KEY) {
        Some(n) if n == node => match declared_method {
            Some(m) if m != method => Err(declared_mismatch(
                configmap,
                METHOD_NAME_KEY,
                m,
                "does not match the method its name and node_name give",
            )),
            _ => Ok(true),
        },
        Some(_) => Ok(false),
        None => match declared_method {
            Some(m) if m != method => Ok(false),
            _ => Err(FenceConfigError::AmbiguousMethod {
                configmap: configmap.to_owned(),
                method: method.to_owned(),
                node: node.to_owned(),
                shared: configmap
                    .strip_prefix(METHOD_PREFIX)
                    .unwrap_or(configmap)
                    .to_owned(),
            }),
        },
    }
}

/// Whether `fence-method-<method>` is the shared method `method`: one naming a node is a per-node
/// method of another split of the same name and is not ours.
fn shared_method_is_ours(
    configmap: &str,
    props: &BTreeMap<String, String>,
    method: &str,
) -> Result<bool, FenceConfigError> {
    if props.contains_key(NODE_NAME_KEY) {
        return Ok(false);
    }
    match props.get(METHOD_NAME_KEY) {
        Some(m) if m != method => Err(declared_mismatch(
            configmap,
            METHOD_NAME_KEY,
            m,
            "does not match the method its name gives",
        )),
        _ => Ok(true),
    }
}

/// Adds a Secret's entries to a method's parameters. A value with a line break cannot be passed
/// as a `name=value` line and is refused.
pub fn add_secret(
    spec: &mut MethodSpec,
    secret: &str,
    data: &BTreeMap<String, Vec<u8>>,
) -> Result<(), FenceConfigError> {
    for (k, v) in data {
        let value = String::from_utf8(v.clone()).map_err(|_| FenceConfigError::Invalid {
            configmap: format!("Secret {secret}"),
            key: "data",
            name: k.clone(),
            value: "<binary>".to_owned(),
            reason: "is not UTF-8 text",
        })?;
        if value.contains(['\n', '\r']) || k.contains(['\n', '\r', '=']) {
            return Err(FenceConfigError::Invalid {
                configmap: format!("Secret {secret}"),
                key: "data",
                name: k.clone(),
                value: "<redacted>".to_owned(),
                reason: "must be one line (it is passed as name=value on the agent's stdin)",
            });
        }
        spec.params.insert(k.clone(), value);
    }
    Ok(())
}

/// The agent's standard input: one `name=value` line per parameter.
pub fn stdin_text(params: &BTreeMap<String, String>) -> String {
    params.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
}

#[cfg(test)]
mod tests;
