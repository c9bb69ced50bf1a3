//! Where a webhook wake may go: the parts of a `wake_url`, and the judgement of each address a
//! wake would connect to against the defaults and `wake_allow`. Pure decisions: nothing here
//! resolves a name or opens a connection (the [`pool`](super::pool) does, with these).
//!
//! The rules, for an address (an IPv4-mapped IPv6 address, or one under the NAT64 or 6to4
//! prefix, is judged as the IPv4 address it holds):
//! - public addresses are allowed;
//! - unspecified (`0.0.0.0/8`, `::`), broadcast, multicast and reserved (`240.0.0.0/4`)
//!   addresses are refused, whatever `wake_allow` says;
//! - link-local (`169.254.0.0/16`, `fe80::/10`) and cloud metadata addresses (`169.254.169.254`,
//!   `fd00:ec2::254`, `100.100.100.200`) are refused unless a `wake_allow` address or network
//!   holds them and is no wider than `169.254.0.0/16` or `fe80::/10` (so `0.0.0.0/0` or a
//!   host name never lets a wake reach the metadata service; `169.254.169.254` does);
//! - loopback (`127.0.0.0/8`, `::1`) and private addresses (`10.0.0.0/8`, `172.16.0.0/12`,
//!   `192.168.0.0/16`, `100.64.0.0/10`, `fc00::/7`, `fec0::/10`) are refused unless a
//!   `wake_allow` address or network holds them, or the URL's host is a name `wake_allow` lists.
//!
//! Metadata host names (`metadata.google.internal` and the like) are refused unless
//! `wake_allow` lists the name; the addresses they resolve to are judged as any others.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The longest `wake_url` accepted.
pub(crate) const MAX_URL: usize = 2048;

/// Host names of cloud metadata services.
const METADATA_NAMES: &[&str] = &[
    "metadata.google.internal",
    "metadata.goog",
    "metadata",
    "instance-data",
    "instance-data.ec2.internal",
];

/// A parsed `wake_url`: `http://host[:port][/path][?query]`, without userinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WakeUrl {
    pub(crate) host: Host,
    pub(crate) port: u16,
    /// Path and query, as sent in the request line (at least `/`; the fragment left out).
    pub(crate) target: String,
}

/// The host of a [`WakeUrl`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Host {
    Ip(IpAddr),
    /// Lower case, without a trailing dot.
    Name(String),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Host::Ip(ip) => write!(f, "{ip}"),
            Host::Name(n) => f.write_str(n),
        }
    }
}

impl WakeUrl {
    /// Parses `url`; the error says what is wrong, and never repeats the URL's userinfo.
    pub(crate) fn parse(url: &str) -> Result<WakeUrl, String> {
        if url.len() > MAX_URL {
            return Err(format!("is longer than {MAX_URL} characters"));
        }
        if let Some((i, c)) = url.char_indices().find(|(_, c)| c.is_ascii_control()) {
            return Err(format!(
                "holds a control character (U+{:04X} at byte {i}); percent-encode it",
                c as u32
            ));
        }
        if let Some(i) = url.find(' ') {
            return Err(format!("holds a space (at byte {i}); percent-encode it as %20"));
        }
        if let Some(i) = url.find(|c: char| !c.is_ascii()) {
            return Err(format!(
                "holds a character that is not ASCII (at byte {i}); percent-encode it"
            ));
        }
        let scheme_len = "http://".len();
        let rest = match url.get(..scheme_len) {
            Some(s) if s.eq_ignore_ascii_case("http://") => &url[scheme_len..],
            _ if url.get(..8).is_some_and(|s| s.eq_ignore_ascii_case("https://")) => {
                return Err(format!(
                    "`{}` is not an http:// URL (https is not supported by this build)",
                    shown(url)
                ))
            }
            _ => return Err(format!("`{}` is not an http:// URL", shown(url))),
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, after) = rest.split_at(end);
        if authority.contains('@') {
            return Err(
                "holds userinfo (credentials before `@`), which wakes never send; a receiver can take a token in the path instead"
                    .into(),
            );
        }
        let (host, port) = host_and_port(authority).map_err(|e| format!("`{}` {e}", shown(url)))?;
        let target = match after.split('#').next().unwrap_or("") {
            "" => "/".to_string(),
            t if t.starts_with('?') => format!("/{t}"),
            t => t.to_string(),
        };
        Ok(WakeUrl { host, port, target })
    }

    /// The URL as logs show it: scheme, host and port (no path or query, which may hold a
    /// token).
    pub(crate) fn shown(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }

    /// The `Host` header of a request to this URL.
    pub(crate) fn host_header(&self) -> String {
        if self.port == 80 {
            self.host.to_string()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Any text meant as a URL, as logs and messages may show it: its scheme and what follows up
/// to the path, without userinfo (so no path, query or fragment), and without control
/// characters.
pub(crate) fn shown(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => (&url[..i + 3], &url[i + 3..]),
        None => ("", url),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let host = rest[..end].rsplit('@').next().unwrap_or("");
    format!("{scheme}{host}")
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(200)
        .collect()
}

/// The host and port of an authority without userinfo (port 80 when none is given).
fn host_and_port(authority: &str) -> Result<(Host, u16), String> {
    let (host, port) = if let Some(inner) = authority.strip_prefix('[') {
        let (v6, tail) = inner
            .split_once(']')
            .ok_or("opens an IPv6 address with `[` and does not close it")?;
        let ip: Ipv6Addr = v6
            .parse()
            .map_err(|_| format!("names `[{v6}]`, which is not an IPv6 address"))?;
        let port = match tail {
            "" => None,
            t => Some(t.strip_prefix(':').ok_or("has text after its IPv6 address")?),
        };
        (Host::Ip(IpAddr::V6(ip)), port)
    } else {
        let (name, port) = match authority.split_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (authority, None),
        };
        if name.is_empty() {
            return Err("names no host".into());
        }
        let host = match name.parse::<Ipv4Addr>() {
            Ok(ip) => Host::Ip(IpAddr::V4(ip)),
            Err(_) => Host::Name(host_name(name)?),
        };
        (host, port)
    };
    let port = match port {
        None | Some("") => 80,
        Some(p) => Some(p)
            .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse::<u16>().ok())
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("names port `{p}`; a port is from 1 to 65535"))?,
    };
    Ok((host, port))
}

/// A host name, checked and made lower case, without its trailing dot.
fn host_name(name: &str) -> Result<String, String> {
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let fine = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
    if name.is_empty() || name.len() > 253 || !name.chars().all(fine) || name.split('.').any(str::is_empty) {
        return Err(format!(
            "names host `{name}`, which is not a host name (letters, digits, `-`, `_` and `.`) or an IP address (IPv6 in brackets)"
        ));
    }
    Ok(name)
}

/// What kind of address a wake would connect to, when it is not a public one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Never allowed.
    Unspecified,
    Broadcast,
    Multicast,
    Reserved,
    /// Allowed only by a narrow enough `wake_allow` network.
    Metadata,
    LinkLocal,
    /// Allowed by `wake_allow`.
    Loopback,
    Private,
}

impl Class {
    fn of(ip: IpAddr) -> Option<Class> {
        match canonical(ip) {
            IpAddr::V4(ip) => Class::of_v4(ip),
            IpAddr::V6(ip) => Class::of_v6(ip),
        }
    }

    fn of_v4(ip: Ipv4Addr) -> Option<Class> {
        let [a, b, ..] = ip.octets();
        Some(match () {
            _ if ip == Ipv4Addr::new(169, 254, 169, 254) || ip == Ipv4Addr::new(100, 100, 100, 200) => Class::Metadata,
            _ if a == 0 => Class::Unspecified,
            _ if ip.is_broadcast() => Class::Broadcast,
            _ if ip.is_multicast() => Class::Multicast,
            _ if a >= 240 => Class::Reserved,
            _ if ip.is_link_local() => Class::LinkLocal,
            _ if ip.is_loopback() => Class::Loopback,
            _ if ip.is_private() || (a == 100 && (b & 0xc0) == 64) => Class::Private,
            _ => return None,
        })
    }

    fn of_v6(ip: Ipv6Addr) -> Option<Class> {
        let first = ip.segments()[0];
        Some(match () {
            _ if ip == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) => Class::Metadata,
            _ if ip.is_unspecified() => Class::Unspecified,
            _ if ip.is_loopback() => Class::Loopback,
            _ if ip.is_multicast() => Class::Multicast,
            _ if (first & 0xffc0) == 0xfe80 => Class::LinkLocal,
            _ if (first & 0xfe00) == 0xfc00 || (first & 0xffc0) == 0xfec0 => Class::Private,
            // The rest of ::/96 (IPv4-compatible addresses, deprecated).
            _ if ip.segments()[..6] == [0; 6] => Class::Reserved,
            _ => return None,
        })
    }

    fn what(self) -> &'static str {
        match self {
            Class::Unspecified => "an unspecified address",
            Class::Broadcast => "the broadcast address",
            Class::Multicast => "a multicast address",
            Class::Reserved => "a reserved address",
            Class::Metadata => "a cloud metadata address",
            Class::LinkLocal => "a link-local address",
            Class::Loopback => "a loopback address",
            Class::Private => "a private address",
        }
    }
}

/// The address `ip` stands for: the IPv4 address an IPv4-mapped, NAT64 (`64:ff9b::/96`) or
/// 6to4 (`2002::/16`) IPv6 address holds, else `ip` itself.
fn canonical(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else { return ip };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let s = v6.segments();
    let v4 = |hi: u16, lo: u16| IpAddr::V4(Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo)));
    match s {
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => v4(hi, lo),
        [0x2002, hi, lo, ..] => v4(hi, lo),
        _ => ip,
    }
}

/// An entry of `wake_allow`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Allowed {
    /// An address (a network of its full length) or a CIDR network, canonical.
    Net(IpAddr, u8),
    /// A host name, lower case, without a trailing dot.
    Name(String),
}

impl Allowed {
    fn parse(entry: &str) -> Result<Allowed, String> {
        let entry = entry.trim();
        let bad = || {
            format!("`{entry}` is not a host name, an IP address or a CIDR network (such as 10.0.0.0/8 or fd00::/8)")
        };
        let (addr, prefix) = match entry.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (entry, None),
        };
        let bare = addr.strip_prefix('[').and_then(|a| a.strip_suffix(']')).unwrap_or(addr);
        match bare.parse::<IpAddr>() {
            Ok(ip) => {
                let full = if ip.is_ipv4() { 32 } else { 128 };
                let prefix = match prefix {
                    None => full,
                    Some(p) => p
                        .parse::<u8>()
                        .ok()
                        .filter(|p| *p <= full)
                        .ok_or_else(|| format!("`{entry}` has a prefix length that is not from 0 to {full}"))?,
                };
                // A network of IPv4-mapped addresses is the IPv4 network it maps.
                Ok(match (ip, canonical(ip)) {
                    (IpAddr::V6(_), IpAddr::V4(v4)) if prefix >= 96 => Allowed::Net(IpAddr::V4(v4), prefix - 96),
                    _ => Allowed::Net(ip, prefix),
                })
            }
            Err(_) if prefix.is_none() => host_name(entry).map(Allowed::Name).map_err(|_| bad()),
            Err(_) => Err(bad()),
        }
    }

    /// Whether this network holds `ip` (canonical).
    fn holds(&self, ip: IpAddr) -> bool {
        match (self, ip) {
            (Allowed::Net(IpAddr::V4(net), p), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(*p)).unwrap_or(0);
                (u32::from(*net) & mask) == (u32::from(ip) & mask)
            }
            (Allowed::Net(IpAddr::V6(net), p), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(*p)).unwrap_or(0);
                (u128::from(*net) & mask) == (u128::from(ip) & mask)
            }
            _ => false,
        }
    }

    /// Whether this is a network no wider than the link-local one of its family.
    fn is_narrow(&self) -> bool {
        match self {
            Allowed::Net(IpAddr::V4(_), p) => *p >= 16,
            Allowed::Net(IpAddr::V6(_), p) => *p >= 10,
            Allowed::Name(_) => false,
        }
    }
}

/// Checks one `wake_allow` entry; returns it as it is kept (trimmed, a name in lower case).
pub(crate) fn allow_entry(entry: &str) -> Result<String, String> {
    Allowed::parse(entry)?;
    Ok(entry.trim().to_ascii_lowercase())
}

/// Where wakes may go: the defaults and `wake_allow`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Policy {
    allowed: Vec<Allowed>,
}

impl Policy {
    /// The policy of `wake_allow` entries; an entry that does not parse is an error naming it.
    pub(crate) fn new(entries: &[String]) -> Result<Policy, String> {
        let allowed = entries.iter().map(|e| Allowed::parse(e)).collect::<Result<_, _>>()?;
        Ok(Policy { allowed })
    }

    /// Why no wake may be sent to `url` whatever its host resolves to, or `None`: a literal
    /// address is judged, a metadata name is refused unless listed.
    pub(crate) fn refuses_url(&self, url: &WakeUrl) -> Option<String> {
        match &url.host {
            Host::Ip(ip) => self.refuses(&url.host, *ip),
            Host::Name(name) if METADATA_NAMES.contains(&name.as_str()) && !self.lists(name) => Some(format!(
                "`{name}` names a cloud metadata service, which wakes may not reach unless wake_allow lists it"
            )),
            Host::Name(_) => None,
        }
    }

    /// Why a wake to `host` may not connect to `ip` (one of the addresses `host` is or resolves
    /// to), or `None` when it may.
    pub(crate) fn refuses(&self, host: &Host, ip: IpAddr) -> Option<String> {
        let class = Class::of(ip)?;
        let ip = canonical(ip);
        let by_network = |narrow: bool| self.allowed.iter().any(|a| a.holds(ip) && (!narrow || a.is_narrow()));
        let allowed = match class {
            Class::Unspecified | Class::Broadcast | Class::Multicast | Class::Reserved => false,
            Class::Metadata | Class::LinkLocal => by_network(true),
            Class::Loopback | Class::Private => by_network(false) || matches!(host, Host::Name(n) if self.lists(n)),
        };
        if allowed {
            return None;
        }
        let hint = match class {
            Class::Unspecified | Class::Broadcast | Class::Multicast | Class::Reserved => {
                "which no wake may go to"
            }
            Class::Metadata | Class::LinkLocal => {
                "which wakes may not reach unless wake_allow lists the address or a network within 169.254.0.0/16 or fe80::/10 holding it"
            }
            Class::Loopback | Class::Private => {
                "which wakes may not reach unless wake_allow lists the address, a network holding it, or the host name"
            }
        };
        let resolved = match host {
            Host::Name(n) => format!("`{n}` resolves to `{ip}`, "),
            Host::Ip(_) => format!("`{ip}` is "),
        };
        Some(format!("{resolved}{}, {hint}", class.what()))
    }

    fn lists(&self, name: &str) -> bool {
        self.allowed.iter().any(|a| matches!(a, Allowed::Name(n) if n == name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(u: &str) -> WakeUrl {
        WakeUrl::parse(u).unwrap()
    }

    fn policy(entries: &[&str]) -> Policy {
        Policy::new(&entries.iter().map(|e| e.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn refused(p: &Policy, u: &str) -> bool {
        p.refuses_url(&url(u)).is_some()
    }

    #[test]
    fn a_url_parts_into_host_port_and_target() {
        let u = url("http://Example.COM.:8080/wake?t=1#frag");
        assert_eq!(u.host, Host::Name("example.com".into()));
        assert_eq!((u.port, u.target.as_str()), (8080, "/wake?t=1"));
        assert_eq!(u.host_header(), "example.com:8080");
        let u = url("http://[::1]?q");
        assert_eq!((u.port, u.target.as_str()), (80, "/?q"));
        assert_eq!(u.host_header(), "[::1]");
        assert_eq!(url("HTTP://10.0.0.1").target, "/");
    }

    #[test]
    fn bad_urls_say_what_is_wrong_without_their_credentials() {
        let e = |u: &str| WakeUrl::parse(u).unwrap_err();
        assert!(e("http://u:secret@h/").contains("userinfo"));
        assert!(!e("http://u:secret@h/").contains("secret"));
        assert!(e("http://h/\r\nX: 1").contains("control character"));
        assert!(e("http://h/a b").contains("space"));
        assert!(e("https://h/").contains("https"));
        assert!(e("ftp://h/").contains("http://"));
        assert!(e("http:///p").contains("no host"));
        assert!(e("http://h:0/").contains("port"));
        assert!(e("http://h:99999/").contains("port"));
        assert!(e("http://h:+80/").contains("port"));
        assert!(e("http://[::1/").contains("IPv6"));
        assert!(e("http://::1/").contains("host"));
        assert!(e("http://h\u{e9}/").contains("ASCII"));
    }

    #[test]
    fn logs_show_a_wake_url_as_scheme_host_and_port_only() {
        let u = url("http://Example.COM.:8080/hook/t0ken-in-path?key=t0ken-in-query#f");
        assert_eq!(u.shown(), "http://example.com:8080");
        assert_eq!(url("http://[::1]/p").shown(), "http://[::1]:80");
        assert_eq!(url("http://10.0.0.1?q=1").shown(), "http://10.0.0.1:80");
        // Text that is no wake URL at all.
        assert_eq!(shown("http://u:p@h:1/t0ken?token=x#f"), "http://h:1");
        assert_eq!(shown("https://h/t0ken"), "https://h");
        assert_eq!(shown("h?t0ken"), "h");
        assert_eq!(shown("ftp://h\r\n/x"), "ftp://h??");
    }

    #[test]
    fn internal_targets_are_refused_by_default_and_public_ones_allowed() {
        let p = Policy::default();
        for u in [
            "http://169.254.169.254/latest",
            "http://169.254.3.4/",
            "http://[fe80::1]/",
            "http://[fd00:ec2::254]/",
            "http://100.100.100.200/",
            "http://0.0.0.0/",
            "http://255.255.255.255/",
            "http://239.1.1.1/",
            "http://[ff02::1]/",
            "http://240.0.0.1/",
            "http://10.1.2.3/",
            "http://172.31.0.1/",
            "http://192.168.0.1/",
            "http://100.64.0.1/",
            "http://[fc00::1]/",
            "http://127.0.0.1/",
            "http://[::1]/",
            "http://[::]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:169.254.169.254]/",
            "http://[64:ff9b::a00:1]/",
            "http://[2002:a00:1::]/",
            "http://metadata.google.internal/",
        ] {
            assert!(refused(&p, u), "{u}");
        }
        for u in [
            "http://93.184.215.14/",
            "http://172.32.0.1/",
            "http://[2606:4700::1]/",
            "http://example.com/",
        ] {
            assert!(!refused(&p, u), "{u}");
        }
    }

    #[test]
    fn wake_allow_lets_loopback_and_private_targets_through_but_never_metadata_by_a_wide_network() {
        let p = policy(&["127.0.0.1", "10.0.0.0/8", "hooks.internal", "::ffff:192.168.0.0/112"]);
        assert!(!refused(&p, "http://127.0.0.1:9/"));
        assert!(
            !refused(&p, "http://[::ffff:127.0.0.1]/"),
            "a mapped address is its IPv4"
        );
        assert!(refused(&p, "http://127.0.0.2/"));
        assert!(!refused(&p, "http://10.200.0.1/"));
        assert!(
            !refused(&p, "http://192.168.4.4/"),
            "a mapped network is its IPv4 network"
        );
        assert!(refused(&p, "http://[::1]/"));
        let listed = Host::Name("hooks.internal".into());
        assert_eq!(p.refuses(&listed, "192.168.1.1".parse().unwrap()), None);
        assert!(p.refuses(&listed, "169.254.169.254".parse().unwrap()).is_some());
        assert!(p
            .refuses(&Host::Name("other".into()), "172.16.0.1".parse().unwrap())
            .is_some());

        let wide = policy(&["0.0.0.0/0", "::/0"]);
        assert!(!refused(&wide, "http://192.168.1.1/"));
        assert!(
            refused(&wide, "http://169.254.169.254/"),
            "a wide network is not enough"
        );
        assert!(refused(&wide, "http://[fe80::1]/"));
        assert!(refused(&wide, "http://0.0.0.0/"), "never");
        let exact = policy(&["169.254.169.254", "fe80::/10", "metadata.google.internal"]);
        assert!(!refused(&exact, "http://169.254.169.254/"));
        assert!(refused(&exact, "http://169.254.1.1/"));
        assert!(!refused(&exact, "http://[fe80::1]/"));
        assert!(!refused(&exact, "http://metadata.google.internal/"));
    }

    #[test]
    fn allow_entries_are_names_addresses_or_networks() {
        assert_eq!(allow_entry(" Hooks.Example ").unwrap(), "hooks.example");
        assert!(allow_entry("10.0.0.0/8").is_ok());
        assert!(allow_entry("[::1]").is_ok());
        assert!(allow_entry("fd00::/8").is_ok());
        assert!(allow_entry("10.0.0.0/33").unwrap_err().contains("prefix"));
        assert!(allow_entry("a b").unwrap_err().contains("CIDR"));
        assert!(allow_entry("host/8").is_err());
        assert!(allow_entry("").is_err());
    }
}
