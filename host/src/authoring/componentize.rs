//! `wharf componentize`: a core wasm module (from clang, Go, ...) into a
//! handler component, so authors need no tool beyond their compiler.

use anyhow::Context as _;
use wit_component::{ComponentEncoder, StringEncoding};
use wit_parser::Resolve;

use super::{HANDLER_WIT, HANDLER_WIT_0_1, HANDLER_WIT_0_2};

/// The module name preview1 programs import WASI from.
const PREVIEW1: &str = "wasi_snapshot_preview1";

/// How to build the component.
#[derive(Debug, Clone, Copy, Default)]
pub struct ComponentizeOptions {
    /// Let the component allocate through `memory.grow` when the module
    /// exports no `cabi_realloc` usable before its own start (Go needs it).
    pub realloc_via_memory_grow: bool,
}

/// Wraps a core module into a component of world `wharf:handler/handler`.
///
/// The world's type information is embedded unless the module already
/// carries it (as `wit-bindgen`'s Rust and C output may); imports of
/// `wasi_snapshot_preview1` are adapted to WASI 0.2 with the reactor adapter
/// matching this host's wasmtime.
pub fn componentize(core: &[u8], options: ComponentizeOptions) -> anyhow::Result<Vec<u8>> {
    let mut module = core.to_vec();
    if !has_component_type(core)? {
        // A module generated from an earlier contract imports its log or
        // outbox by that version's name. One that imports neither is taken
        // for today's: its `handle` is read with today's delivery.
        let wit = if imports_module(core, "wharf:handler/log@0.1.0")? {
            HANDLER_WIT_0_1
        } else if imports_module(core, "wharf:handler/log@0.2.0")?
            || imports_module(core, "wharf:handler/outbox@0.2.0")?
        {
            HANDLER_WIT_0_2
        } else {
            HANDLER_WIT
        };
        let mut resolve = Resolve::default();
        let package = resolve
            .push_str("handler.wit", wit)
            .context("the built-in WIT does not parse")?;
        let world = resolve.select_world(&[package], Some("handler"))?;
        wit_component::embed_component_metadata(
            &mut module,
            &resolve,
            world,
            StringEncoding::UTF8,
        )?;
    }
    let mut encoder = ComponentEncoder::default()
        .validate(true)
        .realloc_via_memory_grow(options.realloc_via_memory_grow)
        .module(&module)
        .context("the input is not a core wasm module that fits the world")?;
    if imports_module(core, PREVIEW1)? {
        encoder = encoder.adapter(
            PREVIEW1,
            wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
        )?;
    }
    encoder.encode().context("cannot build the component")
}

fn has_component_type(core: &[u8]) -> anyhow::Result<bool> {
    for payload in wasmparser::Parser::new(0).parse_all(core) {
        if let wasmparser::Payload::CustomSection(section) = payload.context("not a wasm module")?
            && section.name().starts_with("component-type")
        {
            return Ok(true);
        }
    }
    Ok(false)
}

fn imports_module(core: &[u8], name: &str) -> anyhow::Result<bool> {
    for payload in wasmparser::Parser::new(0).parse_all(core) {
        if let wasmparser::Payload::ImportSection(imports) = payload.context("not a wasm module")? {
            for import in imports.into_imports() {
                if import.context("bad import section")?.module == name {
                    return Ok(true);
                }
            }
        }
    }
    Ok(false)
}
