//! `kubectl node-monitor`: the agents' status, live explain and recent kernel events, read through
//! the API server's pod proxy. A short-lived token of the viewer ServiceAccount, bound to the
//! agents' audience ([`credential`]), goes along in the node API's token header (the proxy drops
//! `Authorization`), and each agent authorizes it (docs/security.md); the caller's own credential
//! never leaves the kubeconfig. Usage and output are in docs/cli.md.
use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::ListParams,
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::Value;

use node_monitor_core::contract::{
    EXPLAIN_PATH, FLIGHT_PATH, MAX_TOKEN_BYTES, STATUS_PATH, TOKEN_HEADER, TRACE_PATH,
};

pub mod credential;
pub mod fleet;
pub mod format;
pub mod version;

use format::{Output, TraceFilter};

/// How long one agent may take to answer.
const AGENT_TIMEOUT: Duration = Duration::from_secs(15);
/// How often `trace --follow` asks the agents for new events.
const FOLLOW_INTERVAL: Duration = Duration::from_secs(2);
/// The largest answer read from an agent.
const MAX_ANSWER_BYTES: usize = 8 << 20;

/// `kubectl node-monitor`: read node-monitor agents through the API server.
#[derive(Debug, clap::Parser)]
#[command(
    name = "kubectl-node_monitor",
    bin_name = "kubectl node-monitor",
    version
)]
pub struct Cli {
    #[command(flatten)]
    pub conn: Connection,
    #[command(subcommand)]
    pub command: Command,
}

/// Where the agents are and who asks.
#[derive(Debug, Clone, clap::Args)]
pub struct Connection {
    /// Kubeconfig (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The namespace of the agents' pods.
    #[arg(
        long,
        global = true,
        default_value = "node-monitor",
        value_parser = node_monitor_core::kubelet::node_name::parse_namespace
    )]
    pub agent_namespace: String,
    /// The label selector of the agents' pods.
    #[arg(
        long,
        global = true,
        default_value = "app.kubernetes.io/name=node-monitor"
    )]
    pub agent_selector: String,
    /// The agents' port (default: the pod's port named `metrics`, else 9101).
    #[arg(long, global = true)]
    pub port: Option<u16>,
    /// A bearer token to send to the agents instead of a minted one; it must be valid for the
    /// agents' audience.
    #[arg(
        long,
        global = true,
        env = "NODE_MONITOR_TOKEN",
        hide_env_values = true,
        value_parser = parse_token
    )]
    pub token: Option<String>,
    /// A file holding that token.
    #[arg(long, global = true, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// The ServiceAccount, in the agents' namespace, whose short-lived token is minted for the
    /// agents (TokenRequest, with the kubeconfig's own identity).
    #[arg(long, global = true, default_value = "node-monitor-viewer")]
    pub viewer_account: String,
    /// The audience of the minted token: the agents' `--api-token-audience`.
    #[arg(long, global = true, default_value = node_monitor_core::contract::names::NODE_API_AUDIENCE)]
    pub audience: String,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Thresholds, signals and headroom, node conditions, degraded sources, recent evictions.
    Status(StatusArgs),
    /// The agent's live decision: what it would evict now, in what order and why.
    Explain(ExplainArgs),
    /// Recent kernel events (OOM kills, reclaim stalls, kswapd wake-ups, reboots) of the agents.
    Trace(TraceArgs),
    /// The OOM flight records of a node: the trajectory of the seconds before each OOM kill and
    /// eviction, as text, JSON or an SVG timeline.
    Flight(FlightArgs),
    /// The plugin's version and every agent's; exits 1 when they skew.
    Version(VersionArgs),
    /// Print the shell completion script for `shell` (bash, zsh, fish, elvish, powershell).
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff).
    Man,
}

#[derive(Debug, clap::Args)]
pub struct VersionArgs {
    /// Only the plugin's own version (the agents are not asked).
    #[arg(long)]
    pub client: bool,
}

/// This plugin's version and commit.
pub const PLUGIN_VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Debug, clap::Args)]
pub struct FlightArgs {
    pub node: String,
    /// `text`, `json` or `yaml` (the agent's answer).
    #[arg(short, long, default_value = "text", value_parser = parse_output)]
    pub output: Output,
    /// Also write the SVG timeline of the record (default: the newest) to this file.
    #[arg(long, value_name = "PATH")]
    pub svg: Option<PathBuf>,
    /// The record to draw (its id, as the text output shows it).
    #[arg(long, value_name = "ID")]
    pub record: Option<u64>,
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// One node (default: every node with an agent).
    pub node: Option<String>,
    /// Only the fleet summary: what holds on every node, from the nodes' annotations (the
    /// agents are not asked).
    #[arg(long, conflicts_with = "node")]
    pub fleet: bool,
    /// `text`, `json` or `yaml`.
    #[arg(short, long, default_value = "text", value_parser = parse_output)]
    pub output: Output,
}

#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    pub node: String,
    /// `json` (as `node-monitor explain` prints it), `yaml` or `text`.
    #[arg(short, long, default_value = "json", value_parser = parse_output)]
    pub output: Output,
}

#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    #[command(flatten)]
    pub filter: TraceFilter,
    /// `text`, `json` (one object per line), `yaml` (one document per event) or `columns`.
    #[arg(short, long, default_value = "text", value_parser = parse_output)]
    pub output: Output,
    /// Keep asking the agents for new events (every 2 s) until interrupted.
    #[arg(short, long)]
    pub follow: bool,
}

fn parse_output(s: &str) -> Result<Output, String> {
    s.parse()
}

/// Runs the plugin.
pub async fn run(cli: &Cli) -> anyhow::Result<ExitCode> {
    // What needs no cluster.
    match &cli.command {
        Command::Completion { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(
                *shell,
                &mut cmd,
                "kubectl-node_monitor",
                &mut std::io::stdout(),
            );
            return Ok(ExitCode::SUCCESS);
        }
        Command::Man => {
            clap_mangen::Man::new(<Cli as clap::CommandFactory>::command())
                .render(&mut std::io::stdout())?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Version(VersionArgs { client: true }) => {
            node_monitor_base::io::print_line(&format!("plugin {PLUGIN_VERSION}"))?;
            return Ok(ExitCode::SUCCESS);
        }
        _ => {}
    }
    let agents = Agents::connect(&cli.conn).await?;
    match &cli.command {
        Command::Version(_) => version(&agents).await,
        Command::Completion { .. } | Command::Man => Ok(ExitCode::SUCCESS),
        Command::Status(a) => status(&agents, a).await,
        Command::Explain(a) => explain(&agents, a).await,
        Command::Trace(a) => trace(&agents, a).await,
        Command::Flight(a) => flight(&agents, a).await,
    }
}

/// Every agent's version from its status answer, against the plugin's.
async fn version(agents: &Agents) -> anyhow::Result<ExitCode> {
    let mut versions = Vec::new();
    for pod in &agents.pods(None).await? {
        let v = match agents.get(pod, STATUS_PATH).await {
            Ok(answer) => {
                Some(format::read_status(&answer).agent_version).filter(|v| !v.is_empty())
            }
            Err(e) => {
                eprintln!("kubectl-node_monitor: {e:#}");
                None
            }
        };
        versions.push((pod.node.clone(), v));
    }
    let (text, skew) = version::version_report(PLUGIN_VERSION, &versions);
    node_monitor_base::io::print_line(&text)?;
    Ok(if skew {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

async fn flight(agents: &Agents, args: &FlightArgs) -> anyhow::Result<ExitCode> {
    let pods = agents.pods(Some(&args.node)).await?;
    let pod = pods
        .first()
        .with_context(|| format!("no agent pod on node {:?}", args.node))?;
    let answer = agents.get(pod, FLIGHT_PATH).await?;
    let (text, svg) = flight_output(&answer, &args.node, args)?;
    if let (Some(path), Some(svg)) = (&args.svg, svg) {
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    }
    node_monitor_base::io::print_line(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// The `flight` command's output and, with `--svg`, the picture of the chosen record. Pure.
pub fn flight_output(
    answer: &Value,
    node: &str,
    args: &FlightArgs,
) -> anyhow::Result<(String, Option<String>)> {
    let records = node_monitor_base::flight_view::records_of(answer)?;
    let text = match args.output {
        Output::Json | Output::Yaml => format::structured(args.output, answer)?.unwrap_or_default(),
        _ if records.is_empty() => format!("{node}: no OOM kill or eviction recorded"),
        _ => records
            .iter()
            .map(|r| node_monitor_base::flight_view::record_text(r, node))
            .collect::<Vec<_>>()
            .join("\n\n"),
    };
    let svg = match (&args.svg, args.record) {
        (None, _) => None,
        (Some(_), id) => {
            let record = match id {
                Some(id) => records.iter().find(|r| r.id == id).with_context(|| {
                    format!("--record {id}: node {node} keeps no record with that id")
                })?,
                None => records
                    .first()
                    .with_context(|| format!("--svg: node {node} has no record to draw"))?,
            };
            Some(node_monitor_base::flight_view::svg::render(record, node)?)
        }
    };
    Ok((text, svg))
}

async fn status(agents: &Agents, args: &StatusArgs) -> anyhow::Result<ExitCode> {
    if args.fleet {
        let nodes = fleet::annotations(&agents.client).await?;
        let text = match args.output {
            Output::Json | Output::Yaml => {
                format::structured(args.output, &fleet::json(&nodes))?.unwrap_or_default()
            }
            _ => fleet::text(&nodes),
        };
        node_monitor_base::io::print_line(&text)?;
        return Ok(ExitCode::SUCCESS);
    }
    // Every node: the fleet's summary first, when the nodes can be listed.
    if args.node.is_none() && !matches!(args.output, Output::Json | Output::Yaml) {
        match fleet::annotations(&agents.client).await {
            Ok(nodes) => node_monitor_base::io::print_line(&fleet::text(&nodes))?,
            Err(e) => eprintln!(
                "kubectl-node_monitor: cannot list nodes ({e:#}); the fleet summary is left out"
            ),
        }
    }
    let pods = agents.pods(args.node.as_deref()).await?;
    let mut answers = Vec::new();
    let mut failed = false;
    for pod in &pods {
        match agents.get(pod, STATUS_PATH).await {
            Ok(v) => answers.push(v),
            Err(e) => {
                failed = true;
                eprintln!("kubectl-node_monitor: {e:#}");
                answers.push(serde_json::json!({"node": pod.node, "error": format!("{e:#}")}));
            }
        }
    }
    let text = match args.output {
        Output::Json | Output::Yaml if args.node.is_some() => {
            format::structured(args.output, answers.first().unwrap_or(&Value::Null))?
                .unwrap_or_default()
        }
        Output::Json | Output::Yaml => {
            format::structured(args.output, &answers)?.unwrap_or_default()
        }
        _ => answers
            .iter()
            .map(|a| format::status_text(&format::read_status(a)))
            .collect::<Vec<_>>()
            .join("\n"),
    };
    node_monitor_base::io::print_line(&text)?;
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

async fn explain(agents: &Agents, args: &ExplainArgs) -> anyhow::Result<ExitCode> {
    let pods = agents.pods(Some(&args.node)).await?;
    let pod = pods
        .first()
        .with_context(|| format!("no agent pod on node {:?}", args.node))?;
    let answer = agents.get(pod, EXPLAIN_PATH).await?;
    let text = match args.output {
        Output::Text | Output::Columns => format::explain_text(&answer),
        Output::Json | Output::Yaml => {
            format::structured(args.output, &answer)?.unwrap_or_default()
        }
    };
    node_monitor_base::io::print_line(&text)?;
    Ok(ExitCode::SUCCESS)
}

async fn trace(agents: &Agents, args: &TraceArgs) -> anyhow::Result<ExitCode> {
    let pods = agents.pods(args.filter.node.as_deref()).await?;
    // Per agent, the number of the next event to ask for.
    let mut since = vec![0u64; pods.len()];
    let mut first = true;
    loop {
        let mut events = Vec::new();
        let mut failed = false;
        for (pod, next) in pods.iter().zip(since.iter_mut()) {
            match agents.get(pod, &format!("{TRACE_PATH}?since={next}")).await {
                Ok(answer) => {
                    let missed = answer.get("missed").and_then(Value::as_u64).unwrap_or(0);
                    if missed > 0 && !first {
                        eprintln!(
                            "kubectl-node_monitor: node {}: {missed} events went out of the agent's buffer before they were read",
                            pod.node
                        );
                    }
                    *next = answer.get("next").and_then(Value::as_u64).unwrap_or(*next);
                    events.extend(format::node_events(&answer, &pod.node));
                }
                Err(e) => {
                    failed = true;
                    eprintln!("kubectl-node_monitor: {e:#}");
                }
            }
        }
        let events = args.filter.apply(events);
        let mut text = format::trace_output(&events, args.output);
        if !first && args.output == Output::Columns {
            // The header once, at the top.
            text = text
                .split_once('\n')
                .map(|(_, rows)| rows.to_owned())
                .unwrap_or_default();
        }
        if !text.is_empty() {
            node_monitor_base::io::print_line(&text)?;
        }
        if !args.follow {
            return Ok(if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            });
        }
        first = false;
        tokio::select! {
            () = tokio::time::sleep(FOLLOW_INTERVAL) => {}
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
        }
    }
}

/// An agent pod: its name, node and port.
#[derive(Debug, Clone)]
pub struct AgentPod {
    pub name: String,
    pub node: String,
    pub port: u16,
}

/// The API client, the credential and where the agents are.
struct Agents {
    client: Client,
    credential: credential::Credential,
    namespace: String,
    selector: String,
    port: Option<u16>,
}

impl Agents {
    async fn connect(conn: &Connection) -> anyhow::Result<Agents> {
        let kubeconfig = match &conn.kubeconfig {
            Some(p) => {
                node_monitor_base::io::check_regular_file(
                    p,
                    "--kubeconfig",
                    node_monitor_base::io::MAX_INPUT_BYTES,
                )?;
                Kubeconfig::read_from(p).with_context(|| format!("--kubeconfig {}", p.display()))?
            }
            None => Kubeconfig::read()
                .context("reading the kubeconfig ($KUBECONFIG or ~/.kube/config)")?,
        };
        let options = KubeConfigOptions {
            context: conn.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .context("loading the kubeconfig")?;
        let client = Client::try_from(config).context("building the API client")?;
        let credential = credential::Credential::new(
            &credential::Choice {
                token: conn.token.as_deref(),
                token_file: conn.token_file.as_ref(),
                namespace: &conn.agent_namespace,
                account: &conn.viewer_account,
                audience: &conn.audience,
            },
            &client,
        )?;
        Ok(Agents {
            client,
            credential,
            namespace: conn.agent_namespace.clone(),
            selector: conn.agent_selector.clone(),
            port: conn.port,
        })
    }

    /// The running agent pods, of one node or all, sorted by node.
    async fn pods(&self, node: Option<&str>) -> anyhow::Result<Vec<AgentPod>> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let mut params = ListParams::default().labels(&self.selector);
        if let Some(node) = node {
            node_monitor_core::kubelet::node_name::parse_node_name(node)
                .map_err(|e| anyhow::anyhow!("node {node:?}: {e}"))?;
            params = params.fields(&format!("spec.nodeName={node}"));
        }
        let list = api.list(&params).await.with_context(|| {
            format!(
                "listing the agent pods in namespace {} ({})",
                self.namespace, self.selector
            )
        })?;
        let mut pods: Vec<AgentPod> = list
            .items
            .iter()
            .filter_map(|p| format::agent_pod(p, self.port))
            .collect();
        pods.sort_by(|a, b| a.node.cmp(&b.node));
        if pods.is_empty() {
            match node {
                Some(n) => bail!(
                    "no running agent pod on node {n:?} in namespace {} ({})",
                    self.namespace,
                    self.selector
                ),
                None => bail!(
                    "no running agent pod in namespace {} ({})",
                    self.namespace,
                    self.selector
                ),
            }
        }
        Ok(pods)
    }

    /// GET `path` of an agent through the pod proxy; its JSON answer, or its error.
    async fn get(&self, pod: &AgentPod, path: &str) -> anyhow::Result<Value> {
        let uri = format!(
            "/api/v1/namespaces/{}/pods/{}:{}/proxy{path}",
            self.namespace, pod.name, pod.port
        );
        let token = self.credential.token().await?;
        let request = http::Request::get(&uri)
            .header(TOKEN_HEADER, format!("Bearer {token}"))
            .header("accept", "application/json")
            .body(kube::client::Body::empty())
            .context("building the request")?;
        let answer = tokio::time::timeout(AGENT_TIMEOUT, async {
            let response = self.client.send(request).await?;
            let status = response.status();
            let body = response.into_body().collect_bytes().await?;
            Ok::<_, kube::Error>((status, body))
        })
        .await
        .with_context(|| format!("node {}: no answer within {AGENT_TIMEOUT:?}", pod.node))?
        .with_context(|| format!("node {}: GET {uri}", pod.node))?;
        let (status, body) = answer;
        if body.len() > MAX_ANSWER_BYTES {
            bail!(
                "node {}: answer of {} bytes, more than {MAX_ANSWER_BYTES}",
                pod.node,
                body.len()
            );
        }
        format::agent_answer(status.as_u16(), &body)
            .with_context(|| format!("node {} ({}/{})", pod.node, self.namespace, pod.name))
    }
}
/// `--token`: not empty (an empty one would send no credential and be answered 401, which
/// names nothing), and not over the agents' bound on a token.
fn parse_token(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err(
            "the token is empty: pass a token, or leave --token (and NODE_MONITOR_TOKEN) \
                    out to mint one"
                .into(),
        );
    }
    if s.len() > MAX_TOKEN_BYTES {
        return Err(format!(
            "the token is {} bytes long; the agents accept at most {MAX_TOKEN_BYTES}",
            s.len()
        ));
    }
    Ok(s.trim().to_owned())
}
