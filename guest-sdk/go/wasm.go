//go:build wasm

package wharf

import (
	"time"

	_ "github.com/wharf-rs/wharf/guest-sdk/go/internal/bindings/exports/wit_exports"

	"github.com/wharf-rs/wharf/guest-sdk/go/internal/bindings/exports/export_wit_world"
	"github.com/wharf-rs/wharf/guest-sdk/go/internal/bindings/imports/wharf_handler_log"
	types "github.com/wharf-rs/wharf/guest-sdk/go/internal/bindings/imports/wharf_handler_types"
)

func init() {
	export_wit_world.Handler = dispatch
}

func dispatch(d types.Delivery) types.Outcome {
	if registered == nil {
		panic("wharf: no handler registered; call wharf.Register from an init function")
	}
	return lower(registered(lift(d)))
}

func lift(d types.Delivery) Delivery {
	props := make([]Property, len(d.Properties))
	for i, p := range d.Properties {
		props[i] = Property{Key: p.Key, Value: liftValue(p.Value)}
	}
	return Delivery{
		Body:          d.Body,
		ContentType:   d.ContentType.SomeOr(""),
		Subject:       d.Subject.SomeOr(""),
		MessageID:     d.MessageId.SomeOr(""),
		CorrelationID: d.CorrelationId.SomeOr(""),
		ReplyTo:       d.ReplyTo.SomeOr(""),
		Properties:    props,
		Address:       d.Address,
		Tenant:        d.Tenant,
		Mount:         d.Mount,
		Attempt:       d.Attempt,
		Presettled:    d.Presettled,
	}
}

func liftValue(v types.Value) Value {
	switch v.Tag() {
	case types.Value_String:
		return v.String()
	case types.Value_Int:
		return v.Int()
	case types.Value_Uint:
		return v.Uint()
	case types.Value_Float:
		return v.Float()
	case types.Value_Boolean:
		return v.Boolean()
	case types.Value_Bytes:
		return v.Bytes()
	case types.Value_Timestamp:
		return time.UnixMilli(v.Timestamp()).UTC()
	case types.Value_Other:
		return Other(v.Other())
	}
	return nil
}

func lower(o Outcome) types.Outcome {
	switch o.kind {
	case OutcomeRetry:
		return types.MakeOutcomeRetry()
	case OutcomeRetryAfter:
		return types.MakeOutcomeRetryAfter(o.delayMs)
	case OutcomeDrop:
		return types.MakeOutcomeDrop()
	}
	return types.MakeOutcomeAck()
}

func writeLog(level Level, message string) {
	wharf_handler_log.Log(wharf_handler_log.Level(level), message)
}
