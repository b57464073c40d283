package envd

// Reading and writing messages in the proto3 JSON mapping
// (protobuf.dev/programming-guides/json), by hand for the few messages of
// envd: field names in lowerCamelCase or as in the .proto (snake_case),
// null for a default value, unknown fields ignored, bytes as base64,
// 64-bit integers as strings (numbers accepted), enums by name (numbers
// accepted), a oneof as at most one of its keys.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// message is a JSON object of a message as read, keyed by lowerCamelCase
// field name. Values are raw JSON; null values are dropped, as they mean
// the default.
type message struct {
	name   string // the message's path in the request, for errors ("process.pty")
	fields map[string]json.RawMessage
}

// parseMessage reads the JSON object b. Duplicate fields (also as two
// spellings of one name) are refused, as protojson refuses them.
func parseMessage(name string, b []byte) (message, error) {
	m := message{name: name, fields: map[string]json.RawMessage{}}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return m, m.errf("", "not valid JSON: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return m, m.errf("", "must be a JSON object")
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return m, m.errf("", "not valid JSON: %v", err)
		}
		key, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return m, m.errf("", "not valid JSON: %v", err)
		}
		name := camelCase(key)
		if _, dup := m.fields[name]; dup {
			return m, m.errf(key, "appears twice")
		}
		if string(raw) == "null" {
			m.fields[name] = nil // present, default; kept to catch duplicates
			continue
		}
		m.fields[name] = raw
	}
	if _, err := dec.Token(); err != nil {
		return m, m.errf("", "not valid JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return m, m.errf("", "has data after its JSON object")
	}
	return m, nil
}

// camelCase turns a proto field name (exit_code) into its JSON name
// (exitCode); a JSON name is returned as it is.
func camelCase(s string) string {
	if !strings.Contains(s, "_") {
		return s
	}
	var b strings.Builder
	up := false
	for _, r := range s {
		switch {
		case r == '_':
			up = true
		case up && 'a' <= r && r <= 'z':
			b.WriteRune(r - 'a' + 'A')
			up = false
		default:
			b.WriteRune(r)
			up = false
		}
	}
	return b.String()
}

// protoError is a request message that does not decode.
func (m message) errf(field, format string, args ...any) *rpcError {
	where := m.name
	if field != "" {
		if where != "" {
			where += "."
		}
		where += field
	}
	if where == "" {
		where = "the request"
	} else {
		where = "field " + where
	}
	return errorf(codeInvalidArgument, "%s: %s", where, fmt.Sprintf(format, args...))
}

// raw returns a field's value; nil when absent or null.
func (m message) raw(name string) json.RawMessage { return m.fields[name] }

// has reports whether the field is set to something other than null.
func (m message) has(name string) bool { return m.fields[name] != nil }

func (m message) str(name string) (string, error) {
	raw := m.raw(name)
	if raw == nil {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", m.errf(name, "want a string")
	}
	return s, nil
}

// optStr returns an optional string field: nil when absent.
func (m message) optStr(name string) (*string, error) {
	if !m.has(name) {
		return nil, nil
	}
	s, err := m.str(name)
	return &s, err
}

func (m message) boolean(name string) (bool, error) {
	switch string(m.raw(name)) {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	}
	return false, m.errf(name, "want true or false")
}

// optBool returns an optional bool field: nil when absent.
func (m message) optBool(name string) (*bool, error) {
	if !m.has(name) {
		return nil, nil
	}
	b, err := m.boolean(name)
	return &b, err
}

// integer reads an integer field in [lo, hi]: a JSON number (integral,
// exponents allowed) or a string holding one.
func (m message) integer(name string, lo, hi int64) (int64, error) {
	raw := m.raw(name)
	if raw == nil {
		return 0, nil
	}
	lit := string(raw)
	if strings.HasPrefix(lit, `"`) {
		if err := json.Unmarshal(raw, &lit); err != nil {
			return 0, m.errf(name, "want an integer")
		}
	} else if !isJSONNumber(lit) {
		return 0, m.errf(name, "want an integer")
	}
	n, err := strconv.ParseInt(lit, 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(lit, 64)
		if ferr != nil || f != math.Trunc(f) || f < -(1<<63) || f >= 1<<63 {
			return 0, m.errf(name, "want an integer, not %s", truncate(lit, 30))
		}
		n = int64(f)
	}
	if n < lo || n > hi {
		return 0, m.errf(name, "%d is out of range [%d, %d]", n, lo, hi)
	}
	return n, nil
}

func isJSONNumber(s string) bool {
	if s == "" {
		return false
	}
	c := s[0]
	return c == '-' || '0' <= c && c <= '9'
}

func (m message) uint32(name string) (uint32, error) {
	n, err := m.integer(name, 0, math.MaxUint32)
	return uint32(n), err
}

// bytes reads a bytes field: standard or URL-safe base64, padded or not.
func (m message) bytes(name string) ([]byte, error) {
	raw := m.raw(name)
	if raw == nil {
		return nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, m.errf(name, "want a base64 string")
	}
	return decodeBase64(s, func() error { return m.errf(name, "not valid base64") })
}

func decodeBase64(s string, bad func() error) ([]byte, error) {
	enc := base64.StdEncoding
	if strings.ContainsAny(s, "-_") {
		enc = base64.URLEncoding
	}
	if len(s)%4 != 0 {
		enc = enc.WithPadding(base64.NoPadding)
	}
	b, err := enc.DecodeString(s)
	if err != nil {
		return nil, bad()
	}
	return b, nil
}

func (m message) strings(name string) ([]string, error) {
	raw := m.raw(name)
	if raw == nil {
		return nil, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, m.errf(name, "want a list of strings")
	}
	out := make([]string, 0, len(items))
	for i, it := range items {
		var s string
		if err := json.Unmarshal(it, &s); err != nil {
			return nil, m.errf(fmt.Sprintf("%s[%d]", name, i), "want a string")
		}
		out = append(out, s)
	}
	return out, nil
}

func (m message) stringMap(name string) (map[string]string, error) {
	raw := m.raw(name)
	if raw == nil {
		return nil, nil
	}
	var items map[string]json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, m.errf(name, "want an object of strings")
	}
	out := make(map[string]string, len(items))
	for k, it := range items {
		var s string
		if err := json.Unmarshal(it, &s); err != nil {
			return nil, m.errf(name+"["+strconv.Quote(k)+"]", "want a string")
		}
		out[k] = s
	}
	return out, nil
}

// enum reads an enum field by name or number; values maps names to
// numbers. An unknown name is refused; an unknown number is kept (proto3
// enums are open).
func (m message) enum(name string, values map[string]int32) (int32, error) {
	raw := m.raw(name)
	if raw == nil {
		return 0, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if v, ok := values[s]; ok {
			return v, nil
		}
		return 0, m.errf(name, "unknown value %q", truncate(s, 40))
	}
	n, err := m.integer(name, math.MinInt32, math.MaxInt32)
	return int32(n), err
}

// sub reads a message field; ok is false when it is absent or null.
func (m message) sub(name string) (message, bool, error) {
	raw := m.raw(name)
	path := name
	if m.name != "" {
		path = m.name + "." + name
	}
	if raw == nil {
		return message{name: path, fields: map[string]json.RawMessage{}}, false, nil
	}
	sm, err := parseMessage(path, raw)
	return sm, true, err
}

// oneof returns which of the names is set, "" if none; two set is an
// error.
func (m message) oneof(names ...string) (string, error) {
	set := ""
	for _, n := range names {
		if m.has(n) {
			if set != "" {
				return "", m.errf("", "%s and %s are one of a kind: set one", set, n)
			}
			set = n
		}
	}
	return set, nil
}

// int64String is an int64 written as a JSON string, as proto3 JSON writes
// 64-bit integers; zero is written as "0" (fields that omit zero use a
// pointer or omitempty on the containing value).
type int64String int64

func (n int64String) MarshalJSON() ([]byte, error) {
	return []byte(`"` + strconv.FormatInt(int64(n), 10) + `"`), nil
}

// timestamp formats t as a google.protobuf.Timestamp in JSON: RFC 3339 in
// UTC with 0, 3, 6 or 9 fractional digits, as protojson writes it (some
// parsers accept no other widths).
func timestamp(t time.Time) string {
	t = t.UTC()
	ns := t.Nanosecond()
	switch {
	case ns == 0:
		return t.Format("2006-01-02T15:04:05Z")
	case ns%1e6 == 0:
		return t.Format("2006-01-02T15:04:05.000Z")
	case ns%1e3 == 0:
		return t.Format("2006-01-02T15:04:05.000000Z")
	}
	return t.Format("2006-01-02T15:04:05.000000000Z")
}
