// {{name}}: a wharf message handler.
package main

import wharf "github.com/wharf-rs/wharf/guest-sdk/go"

func handle(d wharf.Delivery) wharf.Outcome {
	wharf.Infof("attempt %d of message %q", d.Attempt, d.MessageID)
	return wharf.Ack()
}

// The host runs init functions when it starts the handler; it never calls main.
func init() { wharf.Register(handle) }

func main() {}
