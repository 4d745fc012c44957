//! Per-export access control: who may use an export, and how.
//!
//! An export's [`Policy`] names the clients it admits (by source address
//! or by the names in their TLS certificate), whether it is served only
//! over TLS, and which clients get it read-only. The handshake sees the
//! exports through the client's view of them, so a refused client gets
//! `NBD_REP_ERR_POLICY` with the reason, and a log line.

use std::net::IpAddr;

use ipnet::IpNet;
use weir_nbd::Access;

/// One client selector in an allow or read-only list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Source addresses (a single address is a /32 or /128).
    Address(IpNet),
    /// A name in the client certificate: its subject CN or a DNS, email or
    /// URI subject alternative name, compared exactly.
    CertName(String),
}

impl Rule {
    /// `cert:NAME`, `addr:NET`, or a bare address or network.
    pub fn parse(text: &str) -> Result<Rule, String> {
        let address = |net: &str| {
            net.parse::<IpNet>()
                .or_else(|_| net.parse::<IpAddr>().map(IpNet::from))
                .map(Rule::Address)
                .map_err(|_| format!("{net:?} is not an address or network (e.g. 10.0.0.0/8)"))
        };
        match text.split_once(':') {
            Some(("cert", name)) if !name.is_empty() => Ok(Rule::CertName(name.into())),
            Some(("cert", _)) => Err("cert: needs a name".into()),
            Some(("addr", net)) => address(net),
            _ => address(text).map_err(|e| format!("{e}; certificate names are written cert:NAME")),
        }
    }

    fn matches(&self, client: &Client) -> bool {
        match self {
            Rule::Address(net) => client
                .address
                .is_some_and(|ip| net.contains(&canonical(ip))),
            Rule::CertName(name) => client.cert_names.iter().any(|n| n == name),
        }
    }
}

/// An IPv4 client on a dual-stack socket arrives as ::ffff:a.b.c.d.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Who may use one export. The default admits everyone, read-write, with
/// or without TLS.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// Only over TLS.
    pub tls_only: bool,
    /// Empty: every client. Else a client must match one rule.
    pub allow: Vec<Rule>,
    /// Clients matching one of these get the export read-only.
    pub read_only: Vec<Rule>,
}

impl Policy {
    pub fn access(&self, client: &Client) -> Access {
        if !self.allow.is_empty() && !self.allow.iter().any(|rule| rule.matches(client)) {
            return Access::Refused(format!(
                "{} is not allowed to use this export",
                client.who()
            ));
        }
        if self.tls_only {
            return Access::TlsRequired;
        }
        Access::Granted
    }

    pub fn read_only_for(&self, client: &Client) -> bool {
        self.read_only.iter().any(|rule| rule.matches(client))
    }
}

/// The other end of a connection, as access control sees it.
#[derive(Clone, Debug, Default)]
pub struct Client {
    /// None on a Unix socket.
    pub address: Option<IpAddr>,
    /// Names from the verified client certificate (empty without one).
    pub cert_names: Vec<String>,
}

impl Client {
    fn who(&self) -> String {
        let mut who = match self.address {
            Some(ip) => format!("client {}", canonical(ip)),
            None => "a Unix socket client".to_string(),
        };
        if !self.cert_names.is_empty() {
            who += &format!(" (certificate {})", self.cert_names.join(", "));
        }
        who
    }

    /// The names a certificate vouches for: subject CN and the DNS, email
    /// and URI alternative names.
    pub fn names_in_certificate(der: &[u8]) -> Vec<String> {
        use x509_parser::extensions::GeneralName;
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
            return Vec::new();
        };
        let mut names: Vec<String> = cert
            .subject()
            .iter_common_name()
            .filter_map(|cn| cn.as_str().ok().map(str::to_string))
            .collect();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(n) | GeneralName::RFC822Name(n) | GeneralName::URI(n) => {
                        names.push(n.to_string())
                    }
                    _ => {}
                }
            }
        }
        names.dedup();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(address: &str, cert_names: &[&str]) -> Client {
        Client {
            address: Some(address.parse().unwrap()),
            cert_names: cert_names.iter().map(|n| n.to_string()).collect(),
        }
    }

    #[test]
    fn rules_parse_addresses_networks_and_certificate_names() {
        assert_eq!(
            Rule::parse("10.0.0.0/8"),
            Ok(Rule::Address("10.0.0.0/8".parse().unwrap()))
        );
        assert_eq!(
            Rule::parse("addr:::1"),
            Ok(Rule::Address("::1/128".parse().unwrap()))
        );
        assert_eq!(
            Rule::parse("cert:vm-17"),
            Ok(Rule::CertName("vm-17".into()))
        );
        for bad in ["cert:", "vm-17", "10.0.0.0/33", "addr:"] {
            assert!(Rule::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_allow_list_admits_matching_clients_only() {
        let policy = Policy {
            allow: vec![
                Rule::parse("192.168.1.0/24").unwrap(),
                Rule::parse("cert:backup").unwrap(),
            ],
            ..Policy::default()
        };
        assert_eq!(policy.access(&client("192.168.1.9", &[])), Access::Granted);
        // An IPv4 client seen through a dual-stack socket.
        assert_eq!(
            policy.access(&client("::ffff:192.168.1.9", &[])),
            Access::Granted
        );
        assert_eq!(
            policy.access(&client("10.1.1.1", &["backup"])),
            Access::Granted
        );
        assert!(matches!(
            policy.access(&client("10.1.1.1", &["other"])),
            Access::Refused(why) if why.contains("10.1.1.1") && why.contains("other")
        ));
        let unix = Client::default();
        assert!(matches!(policy.access(&unix), Access::Refused(_)));
    }

    #[test]
    fn tls_only_applies_after_the_allow_list() {
        let policy = Policy {
            tls_only: true,
            allow: vec![Rule::parse("cert:a").unwrap()],
            ..Policy::default()
        };
        assert_eq!(policy.access(&client("::1", &["a"])), Access::TlsRequired);
        assert!(matches!(
            policy.access(&client("::1", &[])),
            Access::Refused(_)
        ));
    }

    #[test]
    fn read_only_rules_pick_clients() {
        let policy = Policy {
            read_only: vec![Rule::parse("cert:reader").unwrap()],
            ..Policy::default()
        };
        assert!(policy.read_only_for(&client("::1", &["reader"])));
        assert!(!policy.read_only_for(&client("::1", &["writer"])));
    }
}
