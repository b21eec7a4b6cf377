// Package export_wit_world is where the generated export glue finds the
// world's exported `handle`. The SDK's Register fills in Handler; it lives
// here, not in package wharf, because wharf imports the generated packages.
package export_wit_world

import "github.com/wharf-rs/wharf/guest-sdk/go/internal/bindings/imports/wharf_handler_types"

// Handler is the registered handler, adapted to the generated types.
var Handler func(wharf_handler_types.Delivery) wharf_handler_types.Outcome

// Handle is called by the generated `handle` export.
func Handle(d wharf_handler_types.Delivery) wharf_handler_types.Outcome {
	if Handler == nil {
		panic("wharf: no handler registered; call wharf.Register from an init function")
	}
	return Handler(d)
}
