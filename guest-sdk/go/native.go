//go:build !wasm

package wharf

import (
	"fmt"
	"os"
)

var levelNames = [...]string{"TRACE", "DEBUG", "INFO", "WARN", "ERROR"}

// Off wasm there is no host: log lines go to stderr, so handlers can be
// unit-tested with go test.
func writeLog(level Level, message string) {
	name := "LEVEL"
	if int(level) < len(levelNames) {
		name = levelNames[level]
	}
	fmt.Fprintf(os.Stderr, "%s %s\n", name, message)
}

// Off wasm there is no host to refuse a message: Send and Reply record it
// for Outputs. As the host does, they keep the values GroupSequence and
// Priority point to at the call, not the caller's variables.
func publish(address string, reply bool, m Message) error {
	m.GroupSequence = copied(m.GroupSequence)
	m.Priority = copied(m.Priority)
	record(Output{Address: address, Reply: reply, Message: m})
	return nil
}

func copied[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
