// Decides by the body: "retry" retries at once, "later" retries after a
// delay (the application property delay-ms, default 1000), "bad" is
// dropped, anything else is acknowledged. "publish:ADDRESS" also sends the
// body on to ADDRESS (and answers the message's reply-to, if it has one),
// published with the ack; it is dropped if the mount does not grant that.
package main

import (
	"strconv"
	"strings"

	wharf "github.com/wharf-rs/wharf/guest-sdk/go"
)

func handle(d wharf.Delivery) wharf.Outcome {
	body, ok := d.BodyText()
	var outcome wharf.Outcome
	switch {
	case ok && body == "retry":
		outcome = wharf.Retry()
	case ok && body == "later":
		outcome = wharf.RetryAfterMillis(delayMs(d))
	case ok && body == "bad":
		outcome = wharf.Drop()
	case ok && strings.HasPrefix(body, "publish:"):
		outcome = publish(d, strings.TrimPrefix(body, "publish:"))
	default:
		outcome = wharf.Ack()
	}
	if !ok {
		body = "<binary>"
	}
	wharf.Infof("attempt %d of %q: %v", d.Attempt, body, outcome)
	return outcome
}

func publish(d wharf.Delivery, address string) wharf.Outcome {
	err := wharf.Send(address, wharf.Message{
		Body:       d.Body,
		Subject:    "flaky",
		Properties: []wharf.Property{{Key: "attempt", Value: int64(d.Attempt)}},
	})
	if err == nil && d.ReplyTo != "" {
		err = wharf.Reply(wharf.Message{Body: []byte("sent to " + address)})
	}
	if err != nil {
		wharf.Warn(err.Error())
		return wharf.Drop()
	}
	return wharf.Ack()
}

func delayMs(d wharf.Delivery) uint64 {
	v, _ := d.Property("delay-ms")
	switch ms := v.(type) {
	case uint64:
		return ms
	case int64:
		if ms < 0 {
			return 0
		}
		return uint64(ms)
	case string:
		if n, err := strconv.ParseUint(ms, 10, 64); err == nil {
			return n
		}
	}
	return 1000
}

func init() { wharf.Register(handle) }

func main() {}
