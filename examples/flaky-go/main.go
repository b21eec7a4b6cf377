// Decides by the body: "retry" retries at once, "later" retries after a
// delay (the application property delay-ms, default 1000), "bad" is
// dropped, anything else is acknowledged. "publish:ADDRESS" also sends the
// body on to ADDRESS (and answers the message's reply-to, if it has one),
// published with the ack; it is dropped if the mount does not grant that.
// "mirror:ADDRESS" sends one message to ADDRESS that mirrors the delivery:
// its body, group-id, group-sequence, reply-to-group-id, creation-time,
// absolute-expiry-time, priority and durable, and as application properties
// the delivery's own, then "to" (string) and "user-id" (bytes) when it has
// them, "first-acquirer" (boolean), and "annotation:KEY" for each message
// annotation; acknowledged if that is sent, else dropped.
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
	case ok && strings.HasPrefix(body, "mirror:"):
		outcome = mirror(d, strings.TrimPrefix(body, "mirror:"))
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

func mirror(d wharf.Delivery, address string) wharf.Outcome {
	props := make([]wharf.Property, 0, len(d.Properties)+3+len(d.Annotations))
	props = append(props, d.Properties...)
	if d.To != "" {
		props = append(props, wharf.Property{Key: "to", Value: d.To})
	}
	if d.UserID != nil {
		props = append(props, wharf.Property{Key: "user-id", Value: d.UserID})
	}
	props = append(props, wharf.Property{Key: "first-acquirer", Value: d.FirstAcquirer})
	for _, a := range d.Annotations {
		props = append(props, wharf.Property{Key: "annotation:" + a.Key, Value: a.Value})
	}
	priority := d.Priority
	err := wharf.Send(address, wharf.Message{
		Body:               d.Body,
		GroupID:            d.GroupID,
		GroupSequence:      d.GroupSequence,
		ReplyToGroupID:     d.ReplyToGroupID,
		CreationTime:       d.CreationTime,
		AbsoluteExpiryTime: d.AbsoluteExpiryTime,
		Priority:           &priority,
		Transient:          !d.Durable,
		Properties:         props,
	})
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
