// Package textcheck refuses the characters that could change what a
// string means on its way to a tool: control characters (a newline starts
// a new command in a debugfs script, a carriage return or an escape
// rewrites a log line) and invalid UTF-8. Every path, working directory,
// user, environment variable name and template name a tenant sends, or an
// image's configuration holds, goes through it at the edge; the sinks are
// made safe on their own as well (docs/hardening.md).
package textcheck

import (
	"fmt"
	"unicode/utf8"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Control returns the byte offset of the first control character in s (C0,
// DEL or C1) or of its first invalid UTF-8 byte, and -1 when it has none.
func Control(s string) int {
	for i, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) {
			return i
		}
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
				return i
			}
		}
	}
	return -1
}

// Field checks the value of the named field: a control character or
// invalid UTF-8 is errdefs.ErrInvalid naming the field and where the
// character is.
func Field(field, value string) error {
	i := Control(value)
	if i < 0 {
		return nil
	}
	return fmt.Errorf("%s holds a control character or invalid UTF-8 (%q at byte %d): %w",
		field, value[i:i+1], i, errdefs.ErrInvalid)
}
