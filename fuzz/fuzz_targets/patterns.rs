//! Origins, address patterns, address readings and reply rules, as config
//! authors and publishers write them: parsing, reading and matching never
//! panic, a literal pattern names itself, no reply reaches a broker system
//! address under any broker's reading, and every rendering of untrusted
//! text is bounded and one line.

#![no_main]

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use wharf_core::address;
use wharf_core::brokers::BrokerKind;
use wharf_core::grants::{
    AddressOwners, AddressPattern, HttpPattern, ReplyGrant, Target, guarded, system_name,
};
use wharf_core::text::{self, Untrusted};

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let (Ok(pattern), Ok(address), Ok(host), Ok(port), Ok(raw_ip)) = (
        String::arbitrary(&mut u),
        String::arbitrary(&mut u),
        String::arbitrary(&mut u),
        Option::<u16>::arbitrary(&mut u),
        u128::arbitrary(&mut u),
    ) else {
        return;
    };
    let address_pattern = AddressPattern::new(pattern.clone());
    let _ = address_pattern.matches(&address);
    if address_pattern.is_literal() {
        assert!(address_pattern.matches(&pattern));
    }
    if let Ok(origin) = HttpPattern::parse(&pattern) {
        for scheme in ["http", "https"] {
            let _ = origin.matches(&Target::new(scheme, &host, port));
        }
    }
    let ip = IpAddr::V6(Ipv6Addr::from(raw_ip));
    let _ = guarded(SocketAddr::new(ip, port.unwrap_or(80)), None);
    let owners = AddressOwners::new([
        ("a".to_owned(), vec![address_pattern.clone()]),
        ("b".to_owned(), vec![AddressPattern::new(host.clone())]),
    ]);
    let untrusted = Untrusted::new(address.clone());
    for kind in BrokerKind::ALL {
        let read = address::names(kind, &address);
        let _ = address::pattern_names(kind, &address_pattern);
        let refused = owners.check_reply(kind, "a", &ReplyGrant::Any, &untrusted);
        if let Ok(names) = read {
            if let Some(system) = names.iter().find(|name| system_name(name).is_some()) {
                assert!(
                    refused.is_err(),
                    "{kind:?}: a reply to {address:?}, which reaches the system address {system:?}"
                );
            }
        } else {
            assert!(
                refused.is_err(),
                "{kind:?}: a reply to the unreadable {address:?}"
            );
        }
    }
    // Renderings: bounded, escaped, one line.
    let rendered = untrusted.to_string();
    assert!(
        rendered.len() <= text::SHOWN_BYTES + 32,
        "{}",
        rendered.len()
    );
    assert!(!rendered.contains(['\n', '\r', '\u{1b}']), "{rendered:?}");
    let bounded = text::bounded(pattern.clone(), 64);
    assert!(bounded.len() <= 64 + 4, "{}", bounded.len());
});
