//go:build wasm

package wharf

import (
	"fmt"
	"time"

	_ "github.com/wharf-rs/wharf/guest-sdk/go/internal/bindings/exports/wit_exports"

	"github.com/wharf-rs/wharf/guest-sdk/go/internal/bindings/exports/export_wit_world"
	"github.com/wharf-rs/wharf/guest-sdk/go/internal/bindings/imports/wharf_handler_log"
	outbox "github.com/wharf-rs/wharf/guest-sdk/go/internal/bindings/imports/wharf_handler_outbox"
	types "github.com/wharf-rs/wharf/guest-sdk/go/internal/bindings/imports/wharf_handler_types"
	witTypes "go.bytecodealliance.org/pkg/wit/types"
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
	var userID []byte
	if d.UserId.IsSome() {
		userID = d.UserId.Some()
		if userID == nil {
			userID = []byte{}
		}
	}
	var groupSequence *uint32
	if d.GroupSequence.IsSome() {
		seq := d.GroupSequence.Some()
		groupSequence = &seq
	}
	return Delivery{
		Body:               d.Body,
		ContentType:        d.ContentType.SomeOr(""),
		Subject:            d.Subject.SomeOr(""),
		MessageID:          d.MessageId.SomeOr(""),
		CorrelationID:      d.CorrelationId.SomeOr(""),
		ReplyTo:            d.ReplyTo.SomeOr(""),
		To:                 d.To.SomeOr(""),
		UserID:             userID,
		GroupID:            d.GroupId.SomeOr(""),
		GroupSequence:      groupSequence,
		ReplyToGroupID:     d.ReplyToGroupId.SomeOr(""),
		CreationTime:       liftTime(d.CreationTime),
		AbsoluteExpiryTime: liftTime(d.AbsoluteExpiryTime),
		Priority:           d.Priority,
		Durable:            d.Durable,
		FirstAcquirer:      d.FirstAcquirer,
		Properties:         liftProperties(d.Properties),
		Annotations:        liftProperties(d.Annotations),
		Address:            d.Address,
		Tenant:             d.Tenant,
		Mount:              d.Mount,
		Attempt:            d.Attempt,
		Presettled:         d.Presettled,
	}
}

func liftProperties(ps []types.Property) []Property {
	props := make([]Property, len(ps))
	for i, p := range ps {
		props[i] = Property{Key: p.Key, Value: liftValue(p.Value)}
	}
	return props
}

// liftTime is the zero time for none.
func liftTime(ms witTypes.Option[int64]) time.Time {
	if ms.IsNone() {
		return time.Time{}
	}
	return time.UnixMilli(ms.Some()).UTC()
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

func publish(address string, reply bool, m Message) error {
	var result witTypes.Result[witTypes.Unit, outbox.SendError]
	if reply {
		result = outbox.Reply(lowerMessage(m))
	} else {
		result = outbox.Send(address, lowerMessage(m))
	}
	if !result.IsErr() {
		return nil
	}
	switch result.Err() {
	case outbox.SendError_Denied:
		return ErrDenied
	case outbox.SendError_TooMany:
		return ErrTooMany
	case outbox.SendError_TooLarge:
		return ErrTooLarge
	case outbox.SendError_NoReplyTo:
		return ErrNoReplyTo
	}
	return fmt.Errorf("send-error %d", result.Err())
}

// lowerMessage takes a normalized message.
func lowerMessage(m Message) outbox.Message {
	props := make([]types.Property, len(m.Properties))
	for i, p := range m.Properties {
		props[i] = types.Property{Key: p.Key, Value: lowerValue(p.Value)}
	}
	delay := witTypes.None[uint64]()
	if ms, ok := m.delayMillis(); ok {
		delay = witTypes.Some(ms)
	}
	return outbox.Message{
		Body:               m.Body,
		ContentType:        optional(m.ContentType),
		Subject:            optional(m.Subject),
		MessageId:          optional(m.MessageID),
		CorrelationId:      optional(m.CorrelationID),
		Properties:         props,
		Durable:            !m.Transient,
		GroupId:            optional(m.GroupID),
		GroupSequence:      optionalPtr(m.GroupSequence),
		ReplyToGroupId:     optional(m.ReplyToGroupID),
		Priority:           optionalPtr(m.Priority),
		CreationTime:       optionalTime(m.CreationTime),
		AbsoluteExpiryTime: optionalTime(m.AbsoluteExpiryTime),
		Delay:              delay,
	}
}

func optional(s string) witTypes.Option[string] {
	if s == "" {
		return witTypes.None[string]()
	}
	return witTypes.Some(s)
}

func optionalPtr[T any](p *T) witTypes.Option[T] {
	if p == nil {
		return witTypes.None[T]()
	}
	return witTypes.Some(*p)
}

func optionalTime(t time.Time) witTypes.Option[int64] {
	if t.IsZero() {
		return witTypes.None[int64]()
	}
	return witTypes.Some(t.UnixMilli())
}

// lowerValue takes a value normalValue returned.
func lowerValue(v Value) types.Value {
	switch v := v.(type) {
	case string:
		return types.MakeValueString(v)
	case int64:
		return types.MakeValueInt(v)
	case uint64:
		return types.MakeValueUint(v)
	case float64:
		return types.MakeValueFloat(v)
	case bool:
		return types.MakeValueBoolean(v)
	case []byte:
		return types.MakeValueBytes(v)
	case time.Time:
		return types.MakeValueTimestamp(v.UnixMilli())
	case Other:
		return types.MakeValueOther(string(v))
	}
	return types.MakeValueNull()
}
