//! The deploy tier: the Kustomize variants and the Helm chart rendered and applied server-side with
//! their RBAC and admission policies, the monitoring objects, the alerts with promtool, the
//! dashboard. One test binary for the tier (`cargo test -p node-monitor-tests --test deploy`); each
//! module is one concern, run alone with a filter (`-- deploy_manifests::`).
mod alerts;
mod dashboard;
mod deploy_flowcontrol;
mod deploy_helm;
mod deploy_manifests;
mod deploy_monitoring;
mod deploy_rbac;
