//! A CA of a test's own, with server and client certificates signed by it, made on the spot.
//! One file for the library's unit tests (`base::test_ca`) and the end-to-end tests
//! (`tests/common` includes it by path), so it uses nothing but `rcgen`.

/// The test's CA.
pub(crate) struct TestCa {
    /// The CA's certificate, PEM.
    pub pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

/// A certificate signed by a [`TestCa`] and its key.
pub(crate) struct Leaf {
    /// The certificate, PEM.
    pub cert: String,
    /// The private key, PEM.
    pub key: String,
    /// The certificate, DER.
    pub der: Vec<u8>,
}

impl Leaf {
    /// The certificate and the key in one PEM text, as a kubeconfig's or a node's single
    /// file holds them.
    pub(crate) fn pem(&self) -> String {
        format!("{}{}", self.cert, self.key)
    }
}

impl TestCa {
    /// A CA whose common name is `name`.
    pub(crate) fn new(name: &str) -> TestCa {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let pem = params.self_signed(&key).unwrap().pem();
        TestCa {
            pem,
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A server certificate for 127.0.0.1.
    pub(crate) fn server(&self, cn: &str) -> Leaf {
        self.leaf(cn, None, true)
    }

    /// A client certificate of user `cn`, in group `org` if given.
    pub(crate) fn client(&self, cn: &str, org: Option<&str>) -> Leaf {
        self.leaf(cn, org, false)
    }

    fn leaf(&self, cn: &str, org: Option<&str>, server: bool) -> Leaf {
        let key = rcgen::KeyPair::generate().unwrap();
        let sans = if server {
            vec!["127.0.0.1".to_string()]
        } else {
            vec![]
        };
        let mut params = rcgen::CertificateParams::new(sans).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        if let Some(org) = org {
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, org);
        }
        params.extended_key_usages = vec![if server {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        }];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }
}
