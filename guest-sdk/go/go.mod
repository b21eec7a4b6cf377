module github.com/wharf-rs/wharf/guest-sdk/go

go 1.24

require go.bytecodealliance.org/pkg v0.4.0

// The generated bindings' runtime module, carried in the SDK (see README).
replace go.bytecodealliance.org/pkg => ./third_party/go-pkg
