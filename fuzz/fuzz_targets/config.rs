//! A config file as anyone may write it: parsing never panics, and every
//! error names the file. (`include` reads other files, which fuzzing the
//! file system would make slow and unrepeatable: such inputs are only
//! checked not to panic.)

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use wharf_core::config::Config;

fuzz_target!(|text: &str| {
    let path = Path::new("/nonexistent/fuzz/wharf.toml");
    match Config::parse(text, path) {
        Ok(config) => {
            let _ = config.address_owners();
            let _ = config.mounts().count();
        }
        Err(error) => assert!(
            text.contains("include") || error.to_string().contains("wharf.toml"),
            "{error}"
        ),
    }
});
