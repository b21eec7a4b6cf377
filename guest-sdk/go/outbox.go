package wharf

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// Message is a message a handler publishes with Send or Reply. The zero
// value of every field means "not set": an empty string is no such
// property, a nil GroupSequence or Priority none, a zero time none, a zero
// Delay none, and a message is durable unless Transient.
type Message struct {
	// The body, sent as one data section.
	Body []byte
	// properties.content-type.
	ContentType string
	// properties.subject.
	Subject string
	// properties.message-id. When empty the host derives one from the
	// delivery's message-id and the output's index, so a redelivered
	// message publishes its outputs with the same ids.
	MessageID string
	// properties.correlation-id. When empty, Reply takes the delivery's
	// correlation-id, else its message-id.
	CorrelationID string
	// Application properties. A value is one of the types a Delivery's
	// properties have (string, int64, uint64, float64, bool, []byte,
	// time.Time, nil, Other), or int, int8, int16, int32 (sent as int64),
	// uint, uint8, uint16, uint32 (as uint64) or float32 (as float64).
	Properties []Property
	// properties.group-id: on Artemis and ActiveMQ Classic the broker's
	// message group, so one consumer at a time gets the group's messages.
	GroupID string
	// properties.group-sequence.
	GroupSequence *uint32
	// properties.reply-to-group-id.
	ReplyToGroupID string
	// header.priority (brokers order by 0 to 9); nil: the broker's
	// default, 4.
	Priority *uint8
	// properties.creation-time, sent with millisecond precision.
	CreationTime time.Time
	// properties.absolute-expiry-time, sent with millisecond precision:
	// brokers that honour it discard the message after.
	AbsoluteExpiryTime time.Time
	// The broker may keep the message in memory only (header.durable
	// false). Messages are durable by default.
	Transient bool
	// Deliver no sooner than this after publishing, on brokers that
	// schedule messages (Artemis); rounded down to milliseconds. Zero or
	// negative: no delay.
	Delay time.Duration
}

// The errors Send and Reply return when the host does not take a message;
// nothing of the message was kept. They arrive wrapped with the address:
// test them with errors.Is.
var (
	// ErrDenied: the mount does not grant it (grants.send for the
	// address, grants.reply for a reply).
	ErrDenied = errors.New("denied (the mount's grants.send or grants.reply do not allow it)")
	// ErrTooMany: the delivery already has the mount's max_outputs messages.
	ErrTooMany = errors.New("too-many (the delivery already has the mount's max_outputs messages)")
	// ErrTooLarge: the delivery's messages would exceed the mount's
	// max_output_bytes.
	ErrTooLarge = errors.New("too-large (the delivery's messages would exceed the mount's max_output_bytes)")
	// ErrNoReplyTo: Reply on a delivery without a reply-to.
	ErrNoReplyTo = errors.New("no-reply-to (the delivery has no reply-to)")
)

// Send publishes m to address if the handler returns Ack, before the
// delivery is accepted; any other outcome or a panic discards it. It
// returns nil when the host took the message, ErrDenied, ErrTooMany or
// ErrTooLarge (wrapped) when it did not, or an error for a property value
// of an unsupported type.
//
// Off wasm (go test) Send always succeeds and records the message: see
// Outputs.
func Send(address string, m Message) error {
	m, err := m.normalized()
	if err == nil {
		err = publish(address, false, m)
	}
	if err != nil {
		return fmt.Errorf("wharf: send to %q: %w", address, err)
	}
	return nil
}

// Reply publishes m to the delivery's reply-to if the handler returns Ack,
// as Send does; its CorrelationID, unless set, is the delivery's
// correlation-id, else its message-id. It returns ErrNoReplyTo (wrapped)
// when the delivery has no reply-to, and the errors of Send.
func Reply(m Message) error {
	m, err := m.normalized()
	if err == nil {
		err = publish("", true, m)
	}
	if err != nil {
		return fmt.Errorf("wharf: reply: %w", err)
	}
	return nil
}

// Output is a message Send or Reply took off wasm.
type Output struct {
	// The address given to Send; empty for a reply.
	Address string
	// Whether it came from Reply.
	Reply   bool
	Message Message
}

var (
	outputsMu sync.Mutex
	outputs   []Output
)

// Outputs returns the messages Send and Reply took so far, in order, when
// the package runs off wasm (unit tests: there they always succeed). In a
// component it returns nothing: the host keeps the messages.
func Outputs() []Output {
	outputsMu.Lock()
	defer outputsMu.Unlock()
	return append([]Output(nil), outputs...)
}

// ResetOutputs forgets the messages Outputs returns; call it between tests.
func ResetOutputs() {
	outputsMu.Lock()
	defer outputsMu.Unlock()
	outputs = nil
}

func record(o Output) {
	outputsMu.Lock()
	defer outputsMu.Unlock()
	outputs = append(outputs, o)
}

// normalized returns m with every property value as one of the types a
// Delivery's properties have.
func (m Message) normalized() (Message, error) {
	if len(m.Properties) == 0 {
		return m, nil
	}
	props := make([]Property, len(m.Properties))
	for i, p := range m.Properties {
		v, err := normalValue(p.Value)
		if err != nil {
			return m, fmt.Errorf("property %q: %w", p.Key, err)
		}
		props[i] = Property{Key: p.Key, Value: v}
	}
	m.Properties = props
	return m, nil
}

func normalValue(v Value) (Value, error) {
	switch v := v.(type) {
	case nil, string, int64, uint64, float64, bool, []byte, Other:
		return v, nil
	case time.Time:
		return v, nil
	case int:
		return int64(v), nil
	case int8:
		return int64(v), nil
	case int16:
		return int64(v), nil
	case int32:
		return int64(v), nil
	case uint:
		return uint64(v), nil
	case uint8:
		return uint64(v), nil
	case uint16:
		return uint64(v), nil
	case uint32:
		return uint64(v), nil
	case float32:
		return float64(v), nil
	}
	return nil, fmt.Errorf("unsupported value type %T", v)
}

// delayMillis is Message.Delay in milliseconds, and whether there is one.
func (m Message) delayMillis() (uint64, bool) {
	if m.Delay <= 0 {
		return 0, false
	}
	return uint64(m.Delay / time.Millisecond), true
}
