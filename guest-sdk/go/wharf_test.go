package wharf

import (
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
