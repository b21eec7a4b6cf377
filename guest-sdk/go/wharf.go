// Package wharf lets you write wharf message handlers in Go.
//
// A handler is one function from a Delivery to an Outcome, registered from
// an init function:
//
//	package main
//
//	import (
//		"time"
//
//		wharf "github.com/wharf-rs/wharf/guest-sdk/go"
//	)
//
//	func handle(d wharf.Delivery) wharf.Outcome {
//		wharf.Infof("attempt %d of %s", d.Attempt, d.MessageID)
//		if body, _ := d.BodyText(); body == "later" {
//			return wharf.RetryAfter(2 * time.Second)
//		}
//		return wharf.Ack()
//	}
//
//	func init() { wharf.Register(handle) }
//
//	func main() {}
//
// The host owns the broker: it settles the message by the outcome you
// return, counts attempts, dead-letters and publishes delayed copies. A panic
// counts as Retry. Send and Reply publish messages of the handler's own,
// only if it returns Ack.
//
// Build for wasip1 as a c-shared module, then turn it into a component with
// `wharf componentize` (the project's Makefile does both). Off wasm (go test), the
// package works too: Register only records the handler, the log functions
// write to stderr and Send and Reply record their messages for Outputs, so
// handler logic can be unit-tested natively.
package wharf

import (
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"
)

// RetryCountProperty is the application property that counts the host's
// retry copies.
const RetryCountProperty = "x-ruststream-retry-count"

// Delivery is one delivery of one message to this handler.
type Delivery struct {
	// The message body: the bytes of its data sections, or for an
	// amqp-value body holding a string or binary, its contents.
	Body []byte
	// properties.content-type; empty when the message has none.
	ContentType string
	// properties.subject; empty when the message has none.
	Subject string
	// properties.message-id rendered as text; empty when the message has none.
	MessageID string
	// properties.correlation-id rendered as text; empty when the message has none.
	CorrelationID string
	// properties.reply-to; empty when the message has none.
	ReplyTo string
	// properties.to: the address its publisher wrote on it (not always the
	// address it was delivered from); empty when the message has none.
	To string
	// properties.user-id: the identity its publisher claims (a broker may
	// check it against the publisher's login, or not); nil when the message
	// has none.
	UserID []byte
	// properties.group-id: the group (the broker's message group on Artemis
	// and ActiveMQ Classic) the message belongs to; empty when it has none.
	GroupID string
	// properties.group-sequence: its place within its group; nil when the
	// message has none.
	GroupSequence *uint32
	// properties.reply-to-group-id; empty when the message has none.
	ReplyToGroupID string
	// properties.creation-time (millisecond precision); the zero time when
	// the message has none.
	CreationTime time.Time
	// properties.absolute-expiry-time (millisecond precision); the zero time
	// when the message has none.
	AbsoluteExpiryTime time.Time
	// header.priority: 4 when the message carries none.
	Priority uint8
	// header.durable.
	Durable bool
	// header.first-acquirer, as the broker sets it (many leave it false;
	// Attempt is what counts deliveries).
	FirstAcquirer bool
	// The application properties, in the order the message carries them.
	Properties []Property
	// The message annotations, in the order the message carries them, keys
	// as text (a numeric key as its decimal digits): the broker's (x-opt-*)
	// and wharf's own, such as x-opt-delivery-time on a delayed retry copy
	// and x-opt-wharf-dead-letter-reason on a dead letter. Values are of the
	// types properties have.
	Annotations []Property
	// The address the mount subscribes to.
	Address string
	// The tenant that owns the mount.
	Tenant string
	// The mount this delivery arrived on.
	Mount string
	// Which attempt this is; the first delivery of a message is attempt 1.
	// It counts the broker's redeliveries and the host's retry copies.
	Attempt uint32
	// True when the mount is at-most-once: the broker already let the
	// message go, so Ack, Drop and Retry change nothing on the broker.
	Presettled bool
}

// Property is one application property.
type Property struct {
	Key   string
	Value Value
}

// Value is the typed value of an application property. Its dynamic type is
// one of:
//
//	string    AMQP string and symbol
//	int64     AMQP byte, short, int, long
//	uint64    AMQP ubyte, ushort, uint, ulong
//	float64   AMQP float and double
//	bool      AMQP boolean
//	[]byte    AMQP binary
//	time.Time AMQP timestamp (millisecond precision)
//	nil       AMQP null
//	Other     any other AMQP type (uuid, char, decimal, list, map, ...)
//
// so a type switch reads it.
type Value = any

// Other is an AMQP value of a type without a Go counterpart here, rendered
// as text by the host.
type Other string

// BodyText returns the body as a string, and whether it is valid UTF-8.
func (d Delivery) BodyText() (string, bool) {
	return string(d.Body), utf8.Valid(d.Body)
}

// Property returns the value of the first application property called key.
func (d Delivery) Property(key string) (Value, bool) {
	for _, p := range d.Properties {
		if p.Key == key {
			return p.Value, true
		}
	}
	return nil, false
}

// PropertyString returns the application property key if it is a string.
func (d Delivery) PropertyString(key string) (string, bool) {
	v, _ := d.Property(key)
	s, ok := v.(string)
	return s, ok
}

// Annotation returns the value of the first message annotation called key.
func (d Delivery) Annotation(key string) (Value, bool) {
	for _, p := range d.Annotations {
		if p.Key == key {
			return p.Value, true
		}
	}
	return nil, false
}

// OutcomeKind tells the outcomes apart.
type OutcomeKind uint8

const (
	// OutcomeAck: processed, the message leaves the queue.
	OutcomeAck OutcomeKind = iota
	// OutcomeRetry: failed, deliver it again (counts towards the attempt limit).
	OutcomeRetry
	// OutcomeRetryAfter: failed, deliver it again, not before a delay.
	OutcomeRetryAfter
	// OutcomeDrop: never deliver it again; the dead-letter policy decides.
	OutcomeDrop
)

// Outcome is what the handler decided. Make one with Ack, Retry,
// RetryAfter, RetryAfterMillis or Drop.
type Outcome struct {
	kind    OutcomeKind
	delayMs uint64
}

// Ack: processed, the message leaves the queue.
func Ack() Outcome { return Outcome{kind: OutcomeAck} }

// Retry: failed, deliver it again at once (counts towards the mount's
// attempt limit).
func Retry() Outcome { return Outcome{kind: OutcomeRetry} }

// RetryAfter: failed, deliver it again, not before delay has passed. The
// delay is rounded down to whole milliseconds; a negative one is zero.
func RetryAfter(delay time.Duration) Outcome {
	if delay < 0 {
		delay = 0
	}
	return RetryAfterMillis(uint64(delay / time.Millisecond))
}

// RetryAfterMillis is RetryAfter with the delay in milliseconds.
func RetryAfterMillis(ms uint64) Outcome { return Outcome{kind: OutcomeRetryAfter, delayMs: ms} }

// Drop: never deliver it again; the broker's dead-letter policy decides.
func Drop() Outcome { return Outcome{kind: OutcomeDrop} }

// Kind tells which outcome this is.
func (o Outcome) Kind() OutcomeKind { return o.kind }

// DelayMillis is the delay of a RetryAfter outcome, 0 for the others.
func (o Outcome) DelayMillis() uint64 { return o.delayMs }

// String renders the outcome as the other wharf SDKs do in logs:
// Ack, Retry, RetryAfter(1500), Drop.
func (o Outcome) String() string {
	switch o.kind {
	case OutcomeAck:
		return "Ack"
	case OutcomeRetry:
		return "Retry"
	case OutcomeRetryAfter:
		return "RetryAfter(" + strconv.FormatUint(o.delayMs, 10) + ")"
	case OutcomeDrop:
		return "Drop"
	}
	return "Outcome(" + strconv.Itoa(int(o.kind)) + ")"
}

// Handler is the function a handler component runs for every delivery.
type Handler func(Delivery) Outcome

var registered Handler

// Register makes h the component's handler. Call it from an init function:
// the host runs package initialisation when it starts an instance, but never
// calls main.
func Register(h Handler) {
	registered = h
}

// Level is how important a log line is.
type Level uint8

const (
	LevelTrace Level = iota
	LevelDebug
	LevelInfo
	LevelWarn
	LevelError
)

// Log writes one line into the host's log, tagged with tenant and mount.
func Log(level Level, message string) { writeLog(level, message) }

// Trace logs at trace level.
func Trace(message string) { writeLog(LevelTrace, message) }

// Debug logs at debug level.
func Debug(message string) { writeLog(LevelDebug, message) }

// Info logs at info level.
func Info(message string) { writeLog(LevelInfo, message) }

// Warn logs at warn level.
func Warn(message string) { writeLog(LevelWarn, message) }

// Error logs at error level.
func Error(message string) { writeLog(LevelError, message) }

// Tracef logs at trace level, formatted as by fmt.Sprintf.
func Tracef(format string, args ...any) { writeLog(LevelTrace, fmt.Sprintf(format, args...)) }

// Debugf logs at debug level, formatted as by fmt.Sprintf.
func Debugf(format string, args ...any) { writeLog(LevelDebug, fmt.Sprintf(format, args...)) }

// Infof logs at info level, formatted as by fmt.Sprintf.
func Infof(format string, args ...any) { writeLog(LevelInfo, fmt.Sprintf(format, args...)) }

// Warnf logs at warn level, formatted as by fmt.Sprintf.
func Warnf(format string, args ...any) { writeLog(LevelWarn, fmt.Sprintf(format, args...)) }

// Errorf logs at error level, formatted as by fmt.Sprintf.
func Errorf(format string, args ...any) { writeLog(LevelError, fmt.Sprintf(format, args...)) }
