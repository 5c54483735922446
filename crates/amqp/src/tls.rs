//! [`Tls`]: what `amqps://` trusts and presents besides the defaults.

use std::fmt;

use intake_core::ConfigError;
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::url::AmqpUrl;

/// TLS settings for an `amqps://` connection: a private CA to trust, and a
/// client certificate to present when the broker asks for one (RabbitMQ's
/// `ssl_options.verify = verify_peer`). Without them the connection trusts
/// the system's root certificates and presents no certificate.
///
/// The PEM data is checked when a part is built, so a file that
/// holds no certificate or key is a [`ConfigError`] then, not a handshake
/// that fails later. `Debug` shows which parts are set, never the key.
///
/// ```
/// use intake_amqp::{AmqpSettings, AmqpSource, Tls};
///
/// # fn build() -> std::io::Result<()> {
/// let tls = Tls::new()
///     .ca_certificate_pem(std::fs::read_to_string("ca.pem")?)
///     .client_certificate_pem(std::fs::read("client.pem")?, std::fs::read("client.key")?);
/// let settings = AmqpSettings::new("amqps://app:secret@broker.internal:5671/%2f").tls(tls);
/// let builder = AmqpSource::builder(settings).queue("orders");
/// # drop(builder);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct Tls {
    ca_pem: Option<String>,
    client: Option<ClientCertificate>,
}

#[derive(Clone)]
struct ClientCertificate {
    chain_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("ca_certificate", &self.ca_pem.is_some())
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

impl Tls {
    /// The defaults: the system's root certificates, no client certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the CA certificates in `pem` (one or more `-----BEGIN
    /// CERTIFICATE-----` blocks) besides the system's roots: for a broker
    /// whose certificate a private CA signed.
    pub fn ca_certificate_pem(mut self, pem: impl Into<String>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Presents `chain_pem` (the client certificate first, then any
    /// intermediates, PEM) with its private key `key_pem` (PEM: PKCS#8,
    /// PKCS#1 or SEC1) when the broker asks for a client certificate. For
    /// a PKCS#12 file, convert it first:
    /// `openssl pkcs12 -in client.p12 -nodes -out client.pem`.
    pub fn client_certificate_pem(
        mut self,
        chain_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.client = Some(ClientCertificate {
            chain_pem: chain_pem.into(),
            key_pem: key_pem.into(),
        });
        self
    }

    /// Whether anything beyond the defaults is set.
    pub(crate) fn is_set(&self) -> bool {
        self.ca_pem.is_some() || self.client.is_some()
    }

    /// Checks the PEM data, and that anything set goes with an `amqps://`
    /// `url`. The errors never quote the PEM data (a key is a secret).
    pub(crate) fn check_for(&self, url: &AmqpUrl) -> Result<(), ConfigError> {
        if self.is_set() && !url.is_tls() {
            return Err(ConfigError::new(
                "tls",
                "is set, but the URL is `amqp://`; use `amqps://` (RabbitMQ's TLS port is 5671)",
            ));
        }
        self.validate()
    }

    /// Checks the PEM data. The errors never quote it (a key is a secret).
    fn validate(&self) -> Result<(), ConfigError> {
        if let Some(pem) = &self.ca_pem {
            certificates("tls.ca_certificate", pem.as_bytes())?;
        }
        if let Some(client) = &self.client {
            certificates("tls.client_certificate", &client.chain_pem)?;
            PrivateKeyDer::from_pem_slice(&client.key_pem).map_err(|_| {
                ConfigError::new(
                    "tls.client_key",
                    "holds no PEM private key (PKCS#8 `BEGIN PRIVATE KEY`, PKCS#1 \
                     `BEGIN RSA PRIVATE KEY` or SEC1 `BEGIN EC PRIVATE KEY`)",
                )
            })?;
        }
        Ok(())
    }

    /// lapin's form of these settings.
    pub(crate) fn to_lapin(&self) -> OwnedTLSConfig {
        OwnedTLSConfig {
            identity: self.client.as_ref().map(|client| OwnedIdentity::PKCS8 {
                pem: client.chain_pem.clone(),
                key: client.key_pem.clone(),
            }),
            cert_chain: self.ca_pem.clone(),
        }
    }
}

/// Checks that `pem` holds at least one certificate and nothing unreadable
/// (lapin would skip an unreadable CA silently, and every handshake would
/// then fail with an unknown issuer).
fn certificates(setting: &'static str, pem: &[u8]) -> Result<(), ConfigError> {
    let mut found = 0usize;
    for certificate in CertificateDer::pem_slice_iter(pem) {
        certificate.map_err(|_| {
            ConfigError::new(
                setting,
                "holds a PEM block that is not a readable certificate",
            )
        })?;
        found += 1;
    }
    if found == 0 {
        return Err(ConfigError::new(
            setting,
            "holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A throwaway key, shaped like a real one: the test checks that no
    /// printed form repeats it.
    const KEY: &str =
        "-----BEGIN PRIVATE KEY-----\nAAAA-not-a-key-SECRET\n-----END PRIVATE KEY-----\n";

    #[test]
    fn pem_data_without_a_certificate_or_key_is_a_config_error_that_never_quotes_it() {
        let error = Tls::new()
            .ca_certificate_pem("not a certificate")
            .validate()
            .unwrap_err();
        assert_eq!(error.setting, "tls.ca_certificate");

        let tls = Tls::new().client_certificate_pem("no certificate here", KEY);
        let error = tls.validate().unwrap_err();
        assert_eq!(error.setting, "tls.client_certificate");

        let printed = format!("{tls:?} {error} {error:?}");
        assert!(!printed.contains("SECRET"), "{printed}");
    }

    #[test]
    fn debug_shows_which_parts_are_set() {
        let tls = Tls::new().client_certificate_pem(Vec::new(), KEY);
        assert_eq!(
            format!("{tls:?}"),
            "Tls { ca_certificate: false, client_certificate: true }"
        );
    }
}
