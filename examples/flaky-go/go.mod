module flaky-go

go 1.24

require github.com/wharf-rs/wharf/guest-sdk/go v0.0.0

require go.bytecodealliance.org/pkg v0.4.0 // indirect

// The wharf SDK lives in ./wharf-sdk, and carries the runtime module of its
// generated bindings.
replace (
	github.com/wharf-rs/wharf/guest-sdk/go => ./wharf-sdk
	go.bytecodealliance.org/pkg => ./wharf-sdk/third_party/go-pkg
)
