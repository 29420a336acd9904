//! The control plane's certificates, made fresh for every start: a CA, serving certificates,
//! client certificates (the user is the common name, the group the organization, as the
//! apiserver's x509 authenticator reads them) and the service-account signing key.
//!
//! Keys are ECDSA P-256 (rcgen's default with ring); the apiserver accepts them for TLS and for
//! signing service-account tokens (ES256).
use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// A PEM certificate and its PEM (PKCS#8) private key.
#[derive(Clone)]
pub struct CertAndKey {
    pub cert_pem: String,
    pub key_pem: String,
}

/// The cluster CA: signs every serving and client certificate of one control plane.
pub struct Pki {
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    /// A new self-signed CA.
    pub fn new() -> Result<Self, rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "node-monitor-test-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        Ok(Self {
            ca_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A serving certificate for `common_name` valid for `dns_names` and `ips`.
    pub fn serving(
        &self,
        common_name: &str,
        dns_names: &[&str],
        ips: &[IpAddr],
    ) -> Result<CertAndKey, rcgen::Error> {
        let mut params = CertificateParams::new(
            dns_names
                .iter()
                .map(|s| (*s).to_owned())
                .collect::<Vec<_>>(),
        )?;
        params
            .subject_alt_names
            .extend(ips.iter().copied().map(SanType::IpAddress));
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(&params)
    }

    /// A client certificate for user `user` in group `group` (one group: rcgen keeps one value
    /// per subject attribute).
    pub fn client(&self, user: &str, group: Option<&str>) -> Result<CertAndKey, rcgen::Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        if let Some(g) = group {
            params.distinguished_name.push(DnType::OrganizationName, g);
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(&params)
    }

    fn sign(&self, params: &CertificateParams) -> Result<CertAndKey, rcgen::Error> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(CertAndKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A fresh key pair for signing service-account tokens: the private key (PEM, PKCS#8) for
/// `--service-account-signing-key-file` and the controller manager, the public key (PEM SPKI) for
/// `--service-account-key-file` (which does not read PKCS#8 private keys).
pub fn service_account_key() -> Result<CertAndKey, rcgen::Error> {
    let key = KeyPair::generate()?;
    Ok(CertAndKey {
        cert_pem: key.public_key_pem(),
        key_pem: key.serialize_pem(),
    })
}
