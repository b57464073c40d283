// Package policy decides what a sandbox's egress gateway lets through.
//
// It holds the NetworkPolicy of the API (Policy): it decodes it, checks every
// entry and normalizes it for storage. Compile turns a policy into Rules,
// which judge one flow at a time: a TCP connection by the address the guest
// dialed, the TLS SNI or HTTP Host it sent and the addresses the gateway
// itself resolved for that name; a DNS query by its name.
//
// The package is a pure decision. It does no networking and starts no
// goroutines; Rules are immutable once compiled. The gateway's plumbing asks
// and acts on the answer.
package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Limits on one policy. They bound the work a flow costs the gateway and the
// size of what is stored.
const (
	maxEntries     = 256  // entries in allow, and in deny
	maxEntryLen    = 260  // bytes in one allow or deny entry
	maxCredentials = 64   // credential rules
	maxHeaderLen   = 128  // bytes in a credential's header name
	maxSecretLen   = 64   // bytes in a secret's name
	maxFormatLen   = 4096 // bytes in a credential's format
	maxNameLen     = 253  // bytes in a DNS name, without the trailing dot
	maxLabelLen    = 63   // bytes in one DNS label
	maxProblems    = 10   // problems one Validate error names
	maxQuoted      = 64   // bytes of an offending value an error quotes
)

const (
	egressAllow = "allow"
	egressDeny  = "deny"
)

// Policy is the JSON NetworkPolicy of API.md: what a sandbox may reach and
// which credentials the gateway adds on the way. The zero Policy denies all
// egress.
type Policy struct {
	// Egress decides what no rule names: "allow" or "deny"; "" means deny.
	Egress string `json:"egress"`
	// Allow lists the destinations let through: a DNS name, "*.name" (any
	// name below name, not name itself), an IPv4 address or CIDR, each with
	// an optional ":port".
	Allow []string `json:"allow,omitempty"`
	// Deny lists the destinations refused, in the forms of Allow. Deny wins
	// over Allow, and Allow over Egress.
	Deny []string `json:"deny,omitempty"`
	// Credentials lists the headers the gateway sets on HTTP and HTTPS
	// requests to a host.
	Credentials []Credential `json:"credentials,omitempty"`
}

// Credential is one header the gateway sets, from a stored secret, on every
// HTTP and HTTPS request to exactly Host, replacing any copy the guest sent.
type Credential struct {
	Host   string `json:"host"`             // exact name, no wildcard, no port
	Header string `json:"header"`           // HTTP header name
	Secret string `json:"secret"`           // name of a stored secret
	Format string `json:"format,omitempty"` // "{}" replaced by the secret's value; default "{}"
	// PlainHTTP sets the header on plain HTTP (port 80) too, where the
	// secret crosses the network in clear; by default only HTTPS gets it.
	PlainHTTP bool `json:"plain_http,omitempty"`
}

// Parse decodes a JSON NetworkPolicy and validates it. Unknown fields and
// data after the object are rejected; empty input and JSON null are the
// default policy, which denies all egress. The policy is returned as
// written; Normalized gives the form to store. Errors wrap
// errdefs.ErrInvalid.
func Parse(raw []byte) (Policy, error) {
	var p Policy
	if len(bytes.Trim(raw, " \t\r\n")) == 0 {
		return p, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return Policy{}, fmt.Errorf("network: %s: %w", decodeError(err), errdefs.ErrInvalid)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Policy{}, fmt.Errorf("network policy: unexpected data after the JSON object: %w", errdefs.ErrInvalid)
	}
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	return p, nil
}

// decodeError says what was wrong with a policy's JSON in the API's terms,
// without the decoder's own wording.
func decodeError(err error) string {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te) && te.Field == "":
		return fmt.Sprintf("a NetworkPolicy is a JSON object, not %s", te.Value)
	case errors.As(err, &te):
		return fmt.Sprintf("field %q must be %s, not %s", te.Field, jsonKind(te.Type), te.Value)
	case errors.As(err, &se):
		return fmt.Sprintf("not valid JSON (at byte %d)", se.Offset)
	case strings.HasPrefix(err.Error(), "json: unknown field"):
		return strings.TrimPrefix(err.Error(), "json: ") + ": a NetworkPolicy has egress, allow, deny and credentials"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "the JSON ends early"
	}
	return "not a NetworkPolicy"
}

// jsonKind names what JSON value a Go type takes.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Slice:
		return "a list"
	case reflect.String:
		return "a string"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return t.String()
}

// Validate checks every field and entry of p. The error wraps
// errdefs.ErrInvalid and names each offending entry (up to ten), such as
// `network.allow[2] "10.0.0.0/33": not a valid IPv4 CIDR`.
//
// Egress is "", "allow" or "deny". An allow or deny entry is a DNS name
// (letters, digits, hyphens and dots; labels of 1 to 63 bytes, at most 253
// in all; any case; one trailing dot ignored; a single label such as
// "localhost" is fine, a last label of only digits is not), "*.name", an
// IPv4 address or an IPv4 CIDR (10.1.2.3/8 means 10.0.0.0/8), each with an
// optional ":port" from 1 to 65535 in decimal without leading zeros. IPv6 is
// not supported. Each list holds at most 256 entries of at most 260 bytes.
//
// There are at most 64 credentials. A credential's host is an exact name
// (no wildcard, address or port); its header is an HTTP token of at most 128
// bytes and not one that frames the request or the connection (Host,
// Content-Length, Transfer-Encoding, Connection and the other hop-by-hop
// headers); its secret is 1 to 64 of A-Z a-z 0-9 _ . -; its format is at
// most 4096 bytes of UTF-8 without control characters other than tab and,
// when set, contains "{}". No two credentials share a host and header.
func (p Policy) Validate() error {
	var ps problems
	switch p.Egress {
	case "", egressAllow, egressDeny:
	default:
		ps.addf("network.egress %s: must be %q or %q", quote(p.Egress), egressAllow, egressDeny)
	}
	validateList(&ps, "allow", p.Allow)
	validateList(&ps, "deny", p.Deny)
	validateCredentials(&ps, p.Credentials)
	return ps.err()
}

func validateList(ps *problems, field string, list []string) {
	if len(list) > maxEntries {
		ps.addf("network.%s: %d entries, more than %d", field, len(list), maxEntries)
		return
	}
	for i, s := range list {
		if _, err := parseEntry(s); err != nil {
			ps.addf("network.%s[%d] %s: %v", field, i, quote(s), err)
		}
	}
}

func validateCredentials(ps *problems, creds []Credential) {
	if len(creds) > maxCredentials {
		ps.addf("network.credentials: %d entries, more than %d", len(creds), maxCredentials)
		return
	}
	seen := make(map[[2]string]int, len(creds))
	for i, c := range creds {
		at := fmt.Sprintf("network.credentials[%d]", i)
		host, hostErr := credentialHost(c.Host)
		if hostErr != nil {
			ps.addf("%s.host %s: %v", at, quote(c.Host), hostErr)
		}
		headerErr := checkHeader(c.Header)
		if headerErr != nil {
			ps.addf("%s.header %s: %v", at, quote(c.Header), headerErr)
		}
		if !validSecretName(c.Secret) {
			ps.addf("%s.secret %s: must be 1 to %d of A-Z a-z 0-9 _ . -", at, quote(c.Secret), maxSecretLen)
		}
		if err := checkFormat(c.Format); err != nil {
			ps.addf("%s.format: %v", at, err)
		}
		if hostErr != nil || headerErr != nil {
			continue
		}
		key := [2]string{host, asciiLower(c.Header)}
		if j, dup := seen[key]; dup {
			ps.addf("%s: same host and header as network.credentials[%d]", at, j)
			continue
		}
		seen[key] = i
	}
}

// credentialHost checks a credential's host and returns it normalized.
func credentialHost(s string) (string, error) {
	if strings.ContainsAny(s, "*:[]/") || isNumeric(s) {
		return "", errors.New("must be an exact name (no wildcard, IP address or port)")
	}
	return normalizeName(s)
}

// framingHeaders are the headers, lower case, that frame a request or manage
// the connection. A credential setting one would let a policy desynchronise
// the gateway and the upstream.
var framingHeaders = []string{
	"connection", "content-length", "host", "keep-alive", "proxy-connection",
	"te", "trailer", "transfer-encoding", "upgrade",
}

func checkHeader(s string) error {
	if s == "" || len(s) > maxHeaderLen {
		return fmt.Errorf("must be 1 to %d bytes", maxHeaderLen)
	}
	for i := 0; i < len(s); i++ {
		if !isTokenChar(s[i]) {
			return fmt.Errorf("not a valid HTTP header name: %q not allowed", s[i])
		}
	}
	if slices.Contains(framingHeaders, asciiLower(s)) {
		return errors.New("frames the request or the connection; the gateway does not set it")
	}
	return nil
}

// isTokenChar reports whether c is a tchar of RFC 9110 section 5.6.2.
func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func validSecretName(s string) bool {
	if s == "" || len(s) > maxSecretLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			c == '_' || c == '.' || c == '-'
		if !ok {
			return false
		}
	}
	return true
}

func checkFormat(s string) error {
	switch {
	case s == "":
		return nil
	case len(s) > maxFormatLen:
		return fmt.Errorf("longer than %d bytes", maxFormatLen)
	case !utf8.ValidString(s):
		return errors.New("not valid UTF-8")
	case strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 && r != '\t' || r == 0x7f }):
		return errors.New("holds a control character (CR, LF or another)")
	case !strings.Contains(s, "{}"):
		return errors.New(`must contain "{}", which the secret's value replaces`)
	}
	return nil
}

// Normalized returns p as it is stored and echoed: names lower case without
// a trailing dot, Egress "" as "deny", an empty Format as "{}", empty lists
// as nil. Addresses, CIDRs and ports are kept as written. An entry that is
// not valid is kept as it is.
func (p Policy) Normalized() Policy {
	n := Policy{
		Egress: p.Egress,
		Allow:  normalizeList(p.Allow),
		Deny:   normalizeList(p.Deny),
	}
	if n.Egress == "" {
		n.Egress = egressDeny
	}
	if len(p.Credentials) > 0 {
		n.Credentials = make([]Credential, len(p.Credentials))
		for i, c := range p.Credentials {
			if host, err := credentialHost(c.Host); err == nil {
				c.Host = host
			}
			if c.Format == "" {
				c.Format = "{}"
			}
			n.Credentials[i] = c
		}
	}
	return n
}

func normalizeList(list []string) []string {
	if len(list) == 0 {
		return nil
	}
	out := make([]string, len(list))
	for i, s := range list {
		if e, err := parseEntry(s); err == nil {
			s = e.text
		}
		out[i] = s
	}
	return out
}

// Secrets lists the names of the stored secrets p's credentials use, sorted,
// each once; nil when there are none.
func (p Policy) Secrets() []string {
	var names []string
	for _, c := range p.Credentials {
		names = append(names, c.Secret)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// entryKind is the form of an allow or deny entry.
type entryKind int

const (
	kindName     entryKind = iota // exactly a name
	kindWildcard                  // any name below a name
	kindPrefix                    // an IPv4 address (a /32) or CIDR
)

// entry is a parsed allow or deny entry.
type entry struct {
	kind   entryKind
	name   string       // kindName, kindWildcard: lower case, no trailing dot, no "*."
	prefix netip.Prefix // kindPrefix: masked
	port   uint16       // 0 for any port
	text   string       // the entry normalized: what Verdict.Rule reports
}

// parseEntry parses one allow or deny entry.
func parseEntry(s string) (entry, error) {
	switch {
	case s == "":
		return entry{}, errors.New("empty entry")
	case len(s) > maxEntryLen:
		return entry{}, fmt.Errorf("longer than %d bytes", maxEntryLen)
	case isIPv6(s):
		return entry{}, errors.New("IPv6 is not supported")
	case strings.Count(s, ":") > 1 || strings.ContainsAny(s, "[]"):
		return entry{}, errors.New("not a name, IPv4 address or IPv4 CIDR with an optional :port")
	}
	host, portText, hasPort := strings.Cut(s, ":")
	var e entry
	if hasPort {
		port, err := parsePort(portText)
		if err != nil {
			return entry{}, err
		}
		e.port = port
	}
	switch {
	case strings.Contains(host, "/"):
		p, err := netip.ParsePrefix(host)
		if err != nil || !p.Addr().Is4() {
			return entry{}, errors.New("not a valid IPv4 CIDR")
		}
		e.kind, e.prefix, e.text = kindPrefix, p.Masked(), host
	case isNumeric(host):
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is4() {
			return entry{}, errors.New("not a valid IPv4 address")
		}
		e.kind, e.prefix, e.text = kindPrefix, netip.PrefixFrom(a, 32), host
	case strings.HasPrefix(host, "*.") && !strings.Contains(host[2:], "*"):
		if host == "*." {
			return entry{}, errors.New(`"*." must be followed by a name`)
		}
		name, err := normalizeName(host[2:])
		if err != nil {
			return entry{}, err
		}
		e.kind, e.name, e.text = kindWildcard, name, "*."+name
	case strings.Contains(host, "*"):
		return entry{}, errors.New(`a wildcard is "*." followed by a name`)
	default:
		name, err := normalizeName(host)
		if err != nil {
			return entry{}, err
		}
		e.kind, e.name, e.text = kindName, name, name
	}
	if hasPort {
		e.text += ":" + portText
	}
	return e, nil
}

// isIPv6 reports whether s is an IPv6 address or CIDR, bare or in brackets
// with an optional port.
func isIPv6(s string) bool {
	if strings.Count(s, ":") < 2 && !strings.ContainsAny(s, "[]") {
		return false
	}
	candidates := []string{s}
	if rest, ok := strings.CutPrefix(s, "["); ok {
		if inner, _, ok := strings.Cut(rest, "]"); ok {
			candidates = append(candidates, inner)
		}
	}
	for _, c := range candidates {
		if a, err := netip.ParseAddr(c); err == nil && a.Is6() {
			return true
		}
		if p, err := netip.ParsePrefix(c); err == nil && p.Addr().Is6() {
			return true
		}
	}
	return false
}

// parsePort parses a port from 1 to 65535 written in decimal without
// leading zeros, so that an entry has one spelling.
func parsePort(s string) (uint16, error) {
	bad := fmt.Errorf("port %s: must be a number from 1 to 65535", quote(s))
	if s == "" || len(s) > 5 || s[0] == '0' {
		return 0, bad
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, bad
		}
	}
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		return 0, bad
	}
	return uint16(n), nil
}

// isNumeric reports whether s is made only of digits and dots, with a digit,
// as an IPv4 address is (and no DNS name may be, its last label being all
// digits).
func isNumeric(s string) bool {
	digit := false
	for i := 0; i < len(s); i++ {
		switch {
		case '0' <= s[i] && s[i] <= '9':
			digit = true
		case s[i] != '.':
			return false
		}
	}
	return digit
}

// normalizeName checks that s is a DNS name and returns it lower case
// without its trailing dot.
func normalizeName(s string) (string, error) {
	s = strings.TrimSuffix(s, ".")
	switch {
	case s == "":
		return "", errors.New("empty name")
	case len(s) > maxNameLen:
		return "", fmt.Errorf("name longer than %d bytes", maxNameLen)
	}
	last := ""
	for label := range strings.SplitSeq(s, ".") {
		switch {
		case label == "":
			return "", errors.New("empty label in name")
		case len(label) > maxLabelLen:
			return "", fmt.Errorf("label longer than %d bytes", maxLabelLen)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
				return "", fmt.Errorf("%q is not allowed in a name (letters, digits, hyphens and dots)", c)
			}
		}
		last = label
	}
	if isNumeric(last) {
		return "", errors.New("not a valid IPv4 address or name (a name's last label is not all digits)")
	}
	return asciiLower(s), nil
}

// asciiLower lower-cases the ASCII letters of s and nothing else, so that no
// other character folds into a letter a rule names.
func asciiLower(s string) string {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// quote quotes s for an error message, cut short if long.
func quote(s string) string {
	if len(s) > maxQuoted {
		return strconv.Quote(s[:maxQuoted]) + "..."
	}
	return strconv.Quote(s)
}

// problems collects what Validate found wrong.
type problems struct {
	msgs  []string
	count int
}

func (ps *problems) addf(format string, args ...any) {
	ps.count++
	if len(ps.msgs) < maxProblems {
		ps.msgs = append(ps.msgs, fmt.Sprintf(format, args...))
	}
}

func (ps *problems) err() error {
	if ps.count == 0 {
		return nil
	}
	msg := strings.Join(ps.msgs, "; ")
	if more := ps.count - len(ps.msgs); more > 0 {
		msg += fmt.Sprintf("; and %d more", more)
	}
	return fmt.Errorf("%s: %w", msg, errdefs.ErrInvalid)
}
