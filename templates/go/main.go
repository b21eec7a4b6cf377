// {{name}}: a wharf message handler.
package main

import wharf "github.com/wharf-rs/wharf/guest-sdk/go"

func handle(d wharf.Delivery) wharf.Outcome {
	wharf.Infof("attempt %d of message %q", d.Attempt, d.MessageID)
	// To publish a message if this delivery is acked (the mount must grant
	// the address, see wharf.toml):
	//	if err := wharf.Send("{{name}}.out", wharf.Message{Body: d.Body, Subject: "processed"}); err != nil {
	//		wharf.Warn(err.Error()) // it wraps wharf.ErrDenied, ErrTooMany or ErrTooLarge
	//	}
	return wharf.Ack()
}

// The host runs init functions when it starts the handler; it never calls main.
func init() { wharf.Register(handle) }

func main() {}
