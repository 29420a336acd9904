//! The kubelet's eviction message and event annotations.
use std::collections::BTreeMap;

use super::{
    OFFENDING_CONTAINERS_KEY, OFFENDING_CONTAINERS_USAGE_KEY, OFFENDING_POD_KEY,
    OFFENDING_POD_USAGE_KEY, STARVED_RESOURCE_KEY,
};
use crate::{
    kubelet::pod::PodInfo,
    signals::threshold::{Resource, Threshold, signal_format, signal_resource},
    signals::{Observations, PodUsage},
    units::quantity::{Format, Quantity},
};

/// `evictionMessage`: the kubelet's wording, and its event annotations.
pub fn eviction_message(
    resource: Resource,
    pod: &PodInfo,
    usage: Option<&PodUsage>,
    thresholds: &[&Threshold],
    observations: &Observations,
) -> (String, BTreeMap<String, String>) {
    let mut annotations = BTreeMap::new();
    let mut message = format!("The node was low on resource: {resource}. ");
    // getThresholdMetInfo: the first threshold for this resource that has an observation.
    if let Some((t, obs)) = thresholds.iter().find_map(|t| {
        (signal_resource(t.signal) == resource)
            .then(|| observations.signals.get(&t.signal).map(|o| (*t, o)))
            .flatten()
    }) {
        let available = Quantity::new(obs.available, signal_format(t.signal));
        message.push_str(&format!(
            "Threshold quantity: {}, available: {available}. ",
            t.quantity(obs.capacity)
        ));
    }
    let Some(usage) = usage else {
        return (message, annotations);
    };
    if resource == Resource::Memory
        && let (Some(request), Some(used)) = (&pod.pod_memory_request, usage.memory)
    {
        let used = bytes(used);
        message.push_str(&format!(
            "Pod {} was using {used}, request is {request}, has larger consumption of {resource}. ",
            pod.name
        ));
        annotations.insert(OFFENDING_POD_KEY.into(), pod.name.clone());
        annotations.insert(OFFENDING_POD_USAGE_KEY.into(), used.to_string());
    }
    let mut offending = Vec::new();
    let mut offending_usage = Vec::new();
    for c in &pod.containers {
        let (used, request) = match resource {
            Resource::Memory => (c.usage.memory, &c.memory_request),
            Resource::EphemeralStorage => (c.usage.disk, &c.ephemeral_storage_request),
            Resource::Inodes | Resource::Pids => (None, &c.memory_request),
        };
        let Some(used) = used.map(bytes) else {
            continue;
        };
        if used > *request {
            message.push_str(&format!(
                "Container {} was using {used}, request is {request}, has larger consumption of {resource}. ",
                c.name
            ));
            offending.push(c.name.clone());
            offending_usage.push(used.to_string());
        }
    }
    annotations.insert(OFFENDING_CONTAINERS_KEY.into(), offending.join(","));
    annotations.insert(
        OFFENDING_CONTAINERS_USAGE_KEY.into(),
        offending_usage.join(","),
    );
    annotations.insert(STARVED_RESOURCE_KEY.into(), resource.to_string());
    (message, annotations)
}

fn bytes(v: u64) -> Quantity {
    Quantity::new(i64::try_from(v).unwrap_or(i64::MAX), Format::BinarySI)
}
