//! Tools for handler authors: turn a core module into a handler component,
//! start a project in any supported language, and run one delivery through a
//! component without a broker.

mod componentize;
mod invoke;
mod scaffold;

pub use componentize::{ComponentizeOptions, componentize};
pub use invoke::{InvokeInput, invoke};
pub use scaffold::{Language, scaffold};

/// The WIT contract every handler implements, as built into this binary.
pub const HANDLER_WIT: &str = include_str!("../../../wit/handler.wit");

/// The second version of the contract, which components built against it
/// still run under.
pub const HANDLER_WIT_0_2: &str = include_str!("../../../wit/v0.2.0/handler.wit");

/// The first version of the contract, which components built against it
/// still run under.
pub const HANDLER_WIT_0_1: &str = include_str!("../../../wit/v0.1.0/handler.wit");
