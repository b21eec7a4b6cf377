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
