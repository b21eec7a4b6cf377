package main

import (
	"bytes"
	"reflect"
	"testing"
	"time"

	wharf "github.com/wharf-rs/wharf/guest-sdk/go"
)

func TestOutcomes(t *testing.T) {
	cases := []struct {
		body  string
		props []wharf.Property
		want  string
	}{
		{"ok", nil, "Ack"},
		{"retry", nil, "Retry"},
		{"later", nil, "RetryAfter(1000)"},
		{"later", []wharf.Property{{Key: "delay-ms", Value: "1500"}}, "RetryAfter(1500)"},
		{"later", []wharf.Property{{Key: "delay-ms", Value: uint64(20)}}, "RetryAfter(20)"},
		{"later", []wharf.Property{{Key: "delay-ms", Value: int64(-5)}}, "RetryAfter(0)"},
		{"later", []wharf.Property{{Key: "delay-ms", Value: "soon"}}, "RetryAfter(1000)"},
		{"bad", nil, "Drop"},
		{"\xff", nil, "Ack"},
	}
	for _, c := range cases {
		got := handle(wharf.Delivery{Body: []byte(c.body), Properties: c.props, Attempt: 1}).String()
		if got != c.want {
			t.Errorf("%q %v: got %s, want %s", c.body, c.props, got, c.want)
		}
	}
}

func TestPublish(t *testing.T) {
	wharf.ResetOutputs()
	defer wharf.ResetOutputs()
	got := handle(wharf.Delivery{Body: []byte("publish:out.a"), ReplyTo: "rq", Attempt: 1})
	if got.Kind() != wharf.OutcomeAck {
		t.Fatalf("got %v", got)
	}
	outputs := wharf.Outputs()
	if len(outputs) != 2 {
		t.Fatalf("outputs: %+v", outputs)
	}
	if o := outputs[0]; o.Address != "out.a" || string(o.Message.Body) != "publish:out.a" || o.Message.Subject != "flaky" {
		t.Errorf("sent %+v", o)
	}
	if o := outputs[1]; !o.Reply || string(o.Message.Body) != "sent to out.a" {
		t.Errorf("replied %+v", o)
	}
}

func TestMirror(t *testing.T) {
	wharf.ResetOutputs()
	defer wharf.ResetOutputs()
	seq := uint32(7)
	created, expires := time.UnixMilli(1000).UTC(), time.UnixMilli(2000).UTC()
	d := wharf.Delivery{
		Body:               []byte("mirror:out.m"),
		To:                 "orders",
		UserID:             []byte{1, 2},
		GroupID:            "g",
		GroupSequence:      &seq,
		ReplyToGroupID:     "rg",
		CreationTime:       created,
		AbsoluteExpiryTime: expires,
		Priority:           0,
		Durable:            false,
		FirstAcquirer:      true,
		Properties:         []wharf.Property{{Key: "n", Value: uint64(3)}, {Key: "s", Value: "x"}},
		Annotations:        []wharf.Property{{Key: "x-opt-a", Value: int64(-1)}, {Key: "9", Value: nil}},
		Attempt:            1,
	}
	if got := handle(d); got.Kind() != wharf.OutcomeAck {
		t.Fatalf("got %v", got)
	}
	outputs := wharf.Outputs()
	if len(outputs) != 1 {
		t.Fatalf("outputs: %+v", outputs)
	}
	o := outputs[0]
	m := o.Message
	if o.Address != "out.m" || o.Reply || !bytes.Equal(m.Body, d.Body) || m.GroupID != "g" || m.ReplyToGroupID != "rg" ||
		m.GroupSequence == nil || *m.GroupSequence != 7 || m.Priority == nil || *m.Priority != 0 || !m.Transient ||
		!m.CreationTime.Equal(created) || !m.AbsoluteExpiryTime.Equal(expires) {
		t.Errorf("sent %+v", o)
	}
	want := []wharf.Property{
		{Key: "n", Value: uint64(3)},
		{Key: "s", Value: "x"},
		{Key: "to", Value: "orders"},
		{Key: "user-id", Value: []byte{1, 2}},
		{Key: "first-acquirer", Value: true},
		{Key: "annotation:x-opt-a", Value: int64(-1)},
		{Key: "annotation:9", Value: nil},
	}
	if !reflect.DeepEqual(m.Properties, want) {
		t.Errorf("properties %#v, want %#v", m.Properties, want)
	}

	// Absent fields stay absent; a durable delivery makes a durable message.
	wharf.ResetOutputs()
	if got := handle(wharf.Delivery{Body: []byte("mirror:out.n"), Priority: 4, Durable: true}); got.Kind() != wharf.OutcomeAck {
		t.Fatalf("got %v", got)
	}
	outputs = wharf.Outputs()
	if len(outputs) != 1 {
		t.Fatalf("outputs: %+v", outputs)
	}
	m = outputs[0].Message
	if outputs[0].Address != "out.n" || m.GroupID != "" || m.GroupSequence != nil || m.ReplyToGroupID != "" ||
		!m.CreationTime.IsZero() || !m.AbsoluteExpiryTime.IsZero() || m.Priority == nil || *m.Priority != 4 || m.Transient {
		t.Errorf("sent %+v", outputs[0])
	}
	want = []wharf.Property{{Key: "first-acquirer", Value: false}}
	if !reflect.DeepEqual(m.Properties, want) {
		t.Errorf("properties %#v, want %#v", m.Properties, want)
	}
}
