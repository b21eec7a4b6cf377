package wharf

import (
	"errors"
	"testing"
	"time"
)

func TestOutcomes(t *testing.T) {
	for _, c := range []struct {
		o    Outcome
		kind OutcomeKind
		ms   uint64
		name string
	}{
		{Ack(), OutcomeAck, 0, "Ack"},
		{Retry(), OutcomeRetry, 0, "Retry"},
		{RetryAfter(1500 * time.Millisecond), OutcomeRetryAfter, 1500, "RetryAfter(1500)"},
		{RetryAfter(1999 * time.Microsecond), OutcomeRetryAfter, 1, "RetryAfter(1)"},
		{RetryAfter(-time.Second), OutcomeRetryAfter, 0, "RetryAfter(0)"},
		{RetryAfterMillis(42), OutcomeRetryAfter, 42, "RetryAfter(42)"},
		{Drop(), OutcomeDrop, 0, "Drop"},
	} {
		if c.o.Kind() != c.kind || c.o.DelayMillis() != c.ms || c.o.String() != c.name {
			t.Errorf("%v: kind %d delay %d, want %s", c.o, c.o.Kind(), c.o.DelayMillis(), c.name)
		}
	}
}

func TestDelivery(t *testing.T) {
	d := Delivery{
		Body: []byte("h\xc3\xa9"),
		Properties: []Property{
			{Key: "a", Value: "x"},
			{Key: "n", Value: uint64(3)},
			{Key: "a", Value: "second"},
		},
	}
	if s, ok := d.BodyText(); !ok || s != "hé" {
		t.Errorf("BodyText = %q, %v", s, ok)
	}
	if _, ok := (Delivery{Body: []byte{0xff}}).BodyText(); ok {
		t.Error("0xff is not UTF-8")
	}
	if s, ok := d.PropertyString("a"); !ok || s != "x" {
		t.Errorf("PropertyString(a) = %q, %v", s, ok)
	}
	if _, ok := d.PropertyString("n"); ok {
		t.Error("n is not a string")
	}
	if v, ok := d.Property("n"); !ok || v != uint64(3) {
		t.Errorf("Property(n) = %v, %v", v, ok)
	}
	if _, ok := d.Property("missing"); ok {
		t.Error("missing property found")
	}
}

func TestSendRecordsOffWasm(t *testing.T) {
	ResetOutputs()
	defer ResetOutputs()
	at := time.UnixMilli(1000).UTC()
	if err := Send("out.a", Message{
		Body:       []byte("hi"),
		Subject:    "s",
		Properties: []Property{{Key: "n", Value: 5}, {Key: "u", Value: uint8(7)}, {Key: "f", Value: float32(1.5)}, {Key: "t", Value: at}},
		Delay:      1500 * time.Millisecond,
	}); err != nil {
		t.Fatal(err)
	}
	if err := Reply(Message{Body: []byte("pong")}); err != nil {
		t.Fatal(err)
	}
	got := Outputs()
	if len(got) != 2 {
		t.Fatalf("Outputs() = %v", got)
	}
	sent, replied := got[0], got[1]
	if sent.Address != "out.a" || sent.Reply || string(sent.Message.Body) != "hi" || sent.Message.Subject != "s" {
		t.Errorf("sent = %+v", sent)
	}
	want := []Property{{Key: "n", Value: int64(5)}, {Key: "u", Value: uint64(7)}, {Key: "f", Value: float64(1.5)}, {Key: "t", Value: at}}
	for i, p := range sent.Message.Properties {
		if p != want[i] {
			t.Errorf("property %d = %#v, want %#v", i, p, want[i])
		}
	}
	if ms, ok := sent.Message.delayMillis(); !ok || ms != 1500 {
		t.Errorf("delay = %d, %v", ms, ok)
	}
	if replied.Address != "" || !replied.Reply || string(replied.Message.Body) != "pong" {
		t.Errorf("replied = %+v", replied)
	}
	ResetOutputs()
	if got := Outputs(); len(got) != 0 {
		t.Errorf("after ResetOutputs: %v", got)
	}
}

func TestSendRefusesUnsupportedValues(t *testing.T) {
	ResetOutputs()
	defer ResetOutputs()
	err := Send("out.a", Message{Properties: []Property{{Key: "c", Value: complex(1, 2)}}})
	if err == nil || errors.Is(err, ErrDenied) {
		t.Fatalf("Send with a complex property: %v", err)
	}
	if got := Outputs(); len(got) != 0 {
		t.Errorf("a refused message was recorded: %v", got)
	}
}

func TestAnnotation(t *testing.T) {
	d := Delivery{Annotations: []Property{
		{Key: "x-opt-delivery-time", Value: time.UnixMilli(5).UTC()},
		{Key: "7", Value: "numeric key"},
		{Key: "7", Value: "second"},
	}}
	if v, ok := d.Annotation("7"); !ok || v != "numeric key" {
		t.Errorf("Annotation(7) = %v, %v", v, ok)
	}
	if v, ok := d.Annotation("x-opt-delivery-time"); !ok || !v.(time.Time).Equal(time.UnixMilli(5)) {
		t.Errorf("Annotation(x-opt-delivery-time) = %v, %v", v, ok)
	}
	if _, ok := d.Annotation("missing"); ok {
		t.Error("missing annotation found")
	}
	if _, ok := d.Property("7"); ok {
		t.Error("an annotation found as a property")
	}
}

func TestSendRecordsNewFields(t *testing.T) {
	ResetOutputs()
	defer ResetOutputs()
	seq, prio := uint32(0), uint8(0)
	created, expires := time.UnixMilli(0).UTC(), time.UnixMilli(-1).UTC()
	if err := Send("out.g", Message{
		GroupID:            "g",
		GroupSequence:      &seq,
		ReplyToGroupID:     "rg",
		Priority:           &prio,
		CreationTime:       created,
		AbsoluteExpiryTime: expires,
	}); err != nil {
		t.Fatal(err)
	}
	// What the caller's variables become afterwards is not what was sent.
	seq, prio = 9, 9
	if err := Send("out.none", Message{}); err != nil {
		t.Fatal(err)
	}
	got := Outputs()
	if len(got) != 2 {
		t.Fatalf("Outputs() = %v", got)
	}
	m := got[0].Message
	if m.GroupID != "g" || m.ReplyToGroupID != "rg" || m.GroupSequence == nil || *m.GroupSequence != 0 ||
		m.Priority == nil || *m.Priority != 0 || !m.CreationTime.Equal(created) || !m.AbsoluteExpiryTime.Equal(expires) {
		t.Errorf("sent %+v", m)
	}
	if m := got[1].Message; m.GroupSequence != nil || m.Priority != nil || !m.CreationTime.IsZero() || !m.AbsoluteExpiryTime.IsZero() {
		t.Errorf("a message setting nothing was sent with %+v", m)
	}
}
