//! Self-contained kubeconfig files (credentials embedded as `*-data`, so a file can be copied into
//! a guest VM or handed to `kubectl` as is).
use base64::{Engine as _, engine::general_purpose::STANDARD};

/// How the user of a kubeconfig authenticates.
pub enum Credentials<'a> {
    /// An x509 client certificate and its key (PEM).
    ClientCert { cert_pem: &'a str, key_pem: &'a str },
    /// A bearer token (e.g. a ServiceAccount token from the TokenRequest API).
    Token(&'a str),
    /// An exec credential plugin (`client.authentication.k8s.io/v1`): `command` with `args`,
    /// whose standard output is an `ExecCredential`, as EKS's, GKE's and AKS's kubeconfigs run.
    Exec {
        command: &'a str,
        args: &'a [&'a str],
    },
}

/// Renders a kubeconfig with one cluster, one user and one current context.
pub fn render(server: &str, ca_pem: &str, user: &str, credentials: &Credentials<'_>) -> String {
    let user_block = match credentials {
        Credentials::ClientCert { cert_pem, key_pem } => format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            STANDARD.encode(cert_pem),
            STANDARD.encode(key_pem)
        ),
        Credentials::Token(t) => format!("    token: {t}\n"),
        Credentials::Exec { command, args } => {
            let args: String = args
                .iter()
                .map(|a| format!("      - {}\n", serde_json::to_string(a).unwrap_or_default()))
                .collect();
            format!(
                "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      \
                 command: {}\n      interactiveMode: Never\n      args:\n{args}",
                serde_json::to_string(command).unwrap_or_default()
            )
        }
    };
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: node-monitor-test\n  \
           cluster:\n    \
             server: {server}\n    \
             certificate-authority-data: {ca}\n\
         users:\n\
         - name: {user}\n  \
           user:\n\
         {user_block}\
         contexts:\n\
         - name: {user}@node-monitor-test\n  \
           context:\n    \
             cluster: node-monitor-test\n    \
             user: {user}\n\
         current-context: {user}@node-monitor-test\n",
        ca = STANDARD.encode(ca_pem),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_kubeconfig_kube_rs_accepts() {
        let text = render(
            "https://127.0.0.1:6443",
            "CA",
            "system:serviceaccount:ns:sa",
            &Credentials::Token("tok"),
        );
        let kc = kube::config::Kubeconfig::from_yaml(&text).expect("parse rendered kubeconfig");
        assert_eq!(
            kc.current_context.as_deref(),
            Some("system:serviceaccount:ns:sa@node-monitor-test")
        );
        let cluster = kc.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(
            cluster.certificate_authority_data.as_deref(),
            Some(STANDARD.encode("CA").as_str())
        );
        let auth = kc.auth_infos[0].auth_info.as_ref().expect("user");
        let auth = serde_json::to_value(auth).expect("serialize user");
        assert_eq!(auth["token"], "tok");
    }

    #[test]
    fn embeds_client_certificates() {
        let text = render(
            "https://10.0.2.2:1",
            "CA",
            "admin",
            &Credentials::ClientCert {
                cert_pem: "CERT",
                key_pem: "KEY",
            },
        );
        let kc = kube::config::Kubeconfig::from_yaml(&text).expect("parse rendered kubeconfig");
        let auth = kc.auth_infos[0].auth_info.as_ref().expect("user");
        assert_eq!(
            auth.client_certificate_data.as_deref(),
            Some(STANDARD.encode("CERT").as_str())
        );
        assert!(auth.client_key_data.is_some());
    }
}
