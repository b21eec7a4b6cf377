package main

import (
	"testing"

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
