//! TLS for PostgreSQL with rustls, as libpq's `sslmode` says:
//! `disable` (no TLS), `prefer` (the default: TLS when the server offers it,
//! certificate not checked), `require` (TLS, certificate not checked),
//! `verify-ca` (the chain checked against the roots), `verify-full` (the chain
//! and the host name). Roots: `sslrootcert=FILE` (PEM), or the system's
//! (`sslrootcert=system`, and the default for the verify modes).

use std::str::FromStr;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::Error;

/// The tokio-postgres config of `url` and the TLS connector its `sslmode` asks for.
pub(crate) fn connect_settings(url: &str) -> Result<(tokio_postgres::Config, MakeRustlsConnect), Error> {
    let bad = |what: String| Error::Setup(format!("postgres url: {what}"));
    let (rest, sslmode, rootcert) = take_tls_params(url);
    let mut config = tokio_postgres::Config::from_str(&rest).map_err(|e| bad(e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?;
    let mode = sslmode.as_deref().unwrap_or("prefer");
    let tls = match mode {
        "disable" | "allow" | "prefer" | "require" => {
            config.ssl_mode(match mode {
                "disable" => SslMode::Disable,
                "require" => SslMode::Require,
                _ => SslMode::Prefer,
            });
            builder.dangerous().with_custom_certificate_verifier(Arc::new(NameUnchecked { provider, chain: None })).with_no_client_auth()
        }
        "verify-ca" | "verify-full" => {
            config.ssl_mode(SslMode::Require);
            let roots = Arc::new(roots(rootcert.as_deref()).map_err(bad)?);
            let chain = WebPkiServerVerifier::builder_with_provider(roots, provider.clone()).build().map_err(|e| bad(e.to_string()))?;
            let verifier: Arc<dyn ServerCertVerifier> =
                if mode == "verify-ca" { Arc::new(NameUnchecked { provider, chain: Some(chain) }) } else { chain };
            builder.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth()
        }
        other => return Err(bad(format!("sslmode {other:?} is not one of disable, allow, prefer, require, verify-ca, verify-full"))),
    };
    Ok((config, MakeRustlsConnect::new(tls)))
}

/// `url` without `sslmode` and `sslrootcert` (which tokio-postgres does not
/// read in full), and their values. Works on URLs and `key=value` strings.
fn take_tls_params(url: &str) -> (String, Option<String>, Option<String>) {
    let (mut sslmode, mut rootcert) = (None, None);
    let mut keep = |key: &str, value: &str| match key {
        "sslmode" => {
            sslmode = Some(value.to_string());
            false
        }
        "sslrootcert" => {
            rootcert = Some(percent_decode(value));
            false
        }
        _ => true,
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            Some((base, query)) => {
                let kept: Vec<&str> = query
                    .split('&')
                    .filter(|pair| {
                        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                        keep(k, v)
                    })
                    .collect();
                if kept.is_empty() { base.to_string() } else { format!("{base}?{}", kept.join("&")) }
            }
            None => url.to_string(),
        }
    } else {
        url.split_whitespace()
            .filter(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                keep(k.trim(), v.trim().trim_matches('\''))
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    (rest, sslmode, rootcert)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Some(b) = s.get(i + 1..i + 3).and_then(|hex| u8::from_str_radix(hex, 16).ok()) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The trust anchors: a PEM file, or the system's store.
fn roots(rootcert: Option<&str>) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    match rootcert {
        None | Some("system") => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                let _ = store.add(cert);
            }
            if store.is_empty() {
                return Err(format!("no system root certificates found ({:?}); give sslrootcert=FILE", found.errors));
            }
        }
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path).map_err(|e| format!("sslrootcert {path}: {e}"))?;
            for cert in certs {
                let cert = cert.map_err(|e| format!("sslrootcert {path}: {e}"))?;
                store.add(cert).map_err(|e| format!("sslrootcert {path}: {e}"))?;
            }
            if store.is_empty() {
                return Err(format!("sslrootcert {path}: no certificate in the file"));
            }
        }
    }
    Ok(store)
}

/// A verifier that never checks the host name (libpq's `prefer`, `require`
/// and `verify-ca`): with `chain`, the certificate must lead to one of its
/// roots (`verify-ca`); without, it is not checked at all. The handshake
/// signatures are always verified.
#[derive(Debug)]
struct NameUnchecked {
    provider: Arc<CryptoProvider>,
    chain: Option<Arc<WebPkiServerVerifier>>,
}

impl ServerCertVerifier for NameUnchecked {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else { return Ok(ServerCertVerified::assertion()) };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext { .. })) => {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::take_tls_params;

    #[test]
    fn tls_parameters_are_taken_out_of_urls_and_keyword_strings() {
        let (rest, mode, root) = take_tls_params("postgresql://u@h:5/db?sslmode=verify-full&options=-c%20x&sslrootcert=%2Ftmp%2Fca.pem");
        assert_eq!((rest.as_str(), mode.as_deref(), root.as_deref()), ("postgresql://u@h:5/db?options=-c%20x", Some("verify-full"), Some("/tmp/ca.pem")));
        let (rest, mode, root) = take_tls_params("host=h user=u sslmode=require");
        assert_eq!((rest.as_str(), mode.as_deref(), root), ("host=h user=u", Some("require"), None));
        let (rest, mode, _) = take_tls_params("postgresql://u@h/db?sslmode=disable");
        assert_eq!((rest.as_str(), mode.as_deref()), ("postgresql://u@h/db", Some("disable")));
    }
}
