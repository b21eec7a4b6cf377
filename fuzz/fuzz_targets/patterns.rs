//! Origins, address patterns and reply rules, as config authors and
//! publishers write them: parsing and matching never panic, a literal
//! pattern names itself, and no reply reaches a broker system address.

#![no_main]

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use wharf_core::grants::{
    AddressOwners, AddressPattern, HttpPattern, ReplyGrant, Target, guarded, system_address,
};

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
    let refused = owners.refuse_reply("a", &ReplyGrant::Any, &address);
    if system_address(&address).is_some() {
        assert!(
            refused.is_some(),
            "a reply to the system address {address:?}"
        );
    }
});
