//! The credential the plugin sends to the agents, never the caller's own. By default it is a
//! short-lived token of the viewer ServiceAccount (`node-monitor-viewer` in the agents'
//! namespace). The plugin mints it through the TokenRequest API with the caller's kubeconfig,
//! whatever kind: a token, a client certificate or an exec plugin. The token is bound to the
//! agents' audience (`node-monitor`), which the API server accepts for nothing else, so an
//! agent, or anyone on the pod network between the API server and the agent, cannot replay it
//! against the API server. `--token` and `--token-file` send a token of the caller's choosing
//! instead; the agents accept it only if it is valid for their audience. docs/security.md has
//! the model.
use std::{
    path::PathBuf,
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    core::v1::ServiceAccount,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};

/// The lifetime asked for a minted token: the API server's minimum.
pub const TOKEN_SECONDS: i64 = 600;
/// A minted token is minted again after this, well before it expires (`trace --follow`).
const REMINT_AFTER: Duration = Duration::from_secs(480);
/// The largest token file read.
const MAX_TOKEN_FILE: u64 = 64 * 1024;

/// Where the token comes from.
enum Source {
    /// `--token` or `--token-file`.
    Given(String),
    /// Minted for `namespace/account`, bound to `audience`.
    Mint {
        client: Client,
        namespace: String,
        account: String,
        audience: String,
    },
}

/// The token sent to the agents, minted when first needed and again before it expires.
pub struct Credential {
    source: Source,
    minted: Mutex<Option<(String, Instant)>>,
}

/// What the caller chose.
pub struct Choice<'a> {
    pub token: Option<&'a str>,
    pub token_file: Option<&'a PathBuf>,
    pub namespace: &'a str,
    pub account: &'a str,
    pub audience: &'a str,
}

impl Credential {
    /// The credential for `choice`; `client` mints with the caller's own identity.
    pub fn new(choice: &Choice<'_>, client: &Client) -> anyhow::Result<Self> {
        let source = if let Some(t) = choice.token {
            Source::Given(non_empty(t.trim(), "--token")?)
        } else if let Some(p) = choice.token_file {
            let text =
                node_monitor_base::io::read_file_bounded(p, "the token file", MAX_TOKEN_FILE)?;
            Source::Given(non_empty(
                text.trim(),
                &format!("--token-file {}", p.display()),
            )?)
        } else {
            node_monitor_core::kubelet::node_name::parse_node_name(choice.account)
                .map_err(|e| anyhow::anyhow!("--viewer-account {:?}: {e}", choice.account))?;
            if choice.audience.is_empty() || choice.audience.len() > 253 {
                anyhow::bail!(
                    "--audience {:?}: must be 1 to 253 characters",
                    choice.audience
                );
            }
            Source::Mint {
                client: client.clone(),
                namespace: choice.namespace.to_owned(),
                account: choice.account.to_owned(),
                audience: choice.audience.to_owned(),
            }
        };
        Ok(Self {
            source,
            minted: Mutex::new(None),
        })
    }

    /// The token to send now.
    pub async fn token(&self) -> anyhow::Result<String> {
        let (client, namespace, account, audience) = match &self.source {
            Source::Given(t) => return Ok(t.clone()),
            Source::Mint {
                client,
                namespace,
                account,
                audience,
            } => (client, namespace, account, audience),
        };
        if let Ok(m) = self.minted.lock()
            && let Some((t, at)) = m.as_ref()
            && at.elapsed() < REMINT_AFTER
        {
            return Ok(t.clone());
        }
        let token = mint(client, namespace, account, audience).await?;
        if let Ok(mut m) = self.minted.lock() {
            *m = Some((token.clone(), Instant::now()));
        }
        Ok(token)
    }
}

fn non_empty(t: &str, what: &str) -> anyhow::Result<String> {
    if t.is_empty() {
        anyhow::bail!("{what}: the token is empty");
    }
    Ok(t.to_owned())
}

/// A [`TOKEN_SECONDS`] token of `namespace/account` for `audience` (TokenRequest).
async fn mint(
    client: &Client,
    namespace: &str,
    account: &str,
    audience: &str,
) -> anyhow::Result<String> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        metadata: ObjectMeta::default(),
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![audience.to_owned()]),
            expiration_seconds: Some(TOKEN_SECONDS),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let answer = api
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .with_context(|| {
            format!(
                "minting a token for the ServiceAccount {namespace}/{account} (audience \
                 {audience}); your identity needs `create` on `serviceaccounts/token` for it: \
                 bind the Role node-monitor-viewer in {namespace} (docs/security.md)"
            )
        })?;
    answer
        .status
        .and_then(|s| s.token)
        .filter(|t| !t.is_empty())
        .with_context(|| format!("the API server minted no token for {namespace}/{account}"))
}
