//! Failing and hostile handlers: each failure is a retry, and the host keeps
//! serving everyone else.
