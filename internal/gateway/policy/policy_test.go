package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// apiExample is the NetworkPolicy example of API.md.
const apiExample = `{"egress": "deny",
 "allow": ["example.com", "*.example.org", "api.example.com:443",
           "203.0.113.0/24", "198.51.100.7:5432"],
 "deny":  ["evil.example.org", "203.0.113.9"],
 "credentials": [{"host": "api.example.com", "header": "Authorization",
                  "secret": "openai", "format": "Bearer {}"}]}`

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		raw     string
		want    Policy
		wantErr string // substring; "" for success
	}{
		{name: "empty input is default deny", raw: "", want: Policy{}},
		{name: "whitespace is default deny", raw: " \n\t", want: Policy{}},
		{name: "null is default deny", raw: "null", want: Policy{}},
		{name: "empty object", raw: "{}", want: Policy{}},
		{name: "egress allow", raw: `{"egress":"allow"}`, want: Policy{Egress: "allow"}},
		{
			name: "API example",
			raw:  apiExample,
			want: Policy{
				Egress: "deny",
				Allow:  []string{"example.com", "*.example.org", "api.example.com:443", "203.0.113.0/24", "198.51.100.7:5432"},
				Deny:   []string{"evil.example.org", "203.0.113.9"},
				Credentials: []Credential{
					{Host: "api.example.com", Header: "Authorization", Secret: "openai", Format: "Bearer {}"},
				},
			},
		},
		{name: "returned as written", raw: `{"allow":["Example.COM."]}`, want: Policy{Allow: []string{"Example.COM."}}},
		{name: "unknown field", raw: `{"egress":"deny","subnets":[]}`, wantErr: `unknown field "subnets"`},
		{name: "unknown credential field", raw: `{"credentials":[{"host":"a.com","header":"X","secret":"s","value":"v"}]}`, wantErr: `unknown field "value"`},
		{name: "trailing object", raw: `{}{}`, wantErr: "after the JSON object"},
		{name: "trailing garbage", raw: `{} x`, wantErr: "after the JSON object"},
		{name: "not an object", raw: `[]`, wantErr: "a NetworkPolicy is a JSON object, not array"},
		{name: "wrong type", raw: `{"allow":"example.com"}`, wantErr: `field "allow" must be a list, not string`},
		{name: "truncated", raw: `{"allow":[`, wantErr: "the JSON ends early"},
		{name: "invalid entry", raw: `{"allow":["ok.com","10.0.0.0/33"]}`, wantErr: `network.allow[1] "10.0.0.0/33": not a valid IPv4 CIDR`},
		{name: "invalid egress", raw: `{"egress":"block"}`, wantErr: `network.egress "block"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.raw))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, errdefs.ErrInvalid) {
					t.Fatalf("Parse(%s) error = %v, want ErrInvalid containing %q", tt.raw, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%s): %v", tt.raw, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Parse(%s) = %+v, want %+v", tt.raw, got, tt.want)
			}
		})
	}
}

func TestValidateEgress(t *testing.T) {
	for _, egress := range []string{"", "allow", "deny"} {
		if err := (Policy{Egress: egress}).Validate(); err != nil {
			t.Errorf("egress %q: %v", egress, err)
		}
	}
	for _, egress := range []string{"Allow", "DENY", "none", " deny", "allow-all"} {
		err := Policy{Egress: egress}.Validate()
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "network.egress") {
			t.Errorf("egress %q: error %v, want ErrInvalid naming network.egress", egress, err)
		}
	}
}

func TestValidateEntries(t *testing.T) {
	tests := []struct {
		name    string
		entry   string
		wantErr string // substring; "" for valid
	}{
		// Names.
		{name: "name", entry: "example.com"},
		{name: "name upper case", entry: "EXAMPLE.Com"},
		{name: "name trailing dot", entry: "example.com."},
		{name: "single label", entry: "localhost"},
		{name: "hyphen and digits", entry: "a-1.x2.example"},
		{name: "idna name", entry: "xn--bcher-kva.example"},
		{name: "label of 63", entry: strings.Repeat("a", 63) + ".com"},
		{name: "label of 64", entry: strings.Repeat("a", 64) + ".com", wantErr: "label longer than 63"},
		{name: "name of 253", entry: longName(253)},
		{name: "name of 253 with trailing dot", entry: longName(253) + "."},
		{name: "name of 254", entry: longName(254), wantErr: "name longer than 253"},
		{name: "two trailing dots", entry: "example.com..", wantErr: "empty label"},
		{name: "leading dot", entry: ".example.com", wantErr: "empty label"},
		{name: "double dot", entry: "a..com", wantErr: "empty label"},
		{name: "lone dot", entry: ".", wantErr: "empty name"},
		{name: "underscore", entry: "_dmarc.example.com", wantErr: `'_' is not allowed`},
		{name: "space", entry: "exa mple.com", wantErr: `' ' is not allowed`},
		{name: "non-ascii", entry: "bücher.example", wantErr: "is not allowed"},
		{name: "url", entry: "https://example.com", wantErr: "port"},
		{name: "path", entry: "example.com/x", wantErr: "not a valid IPv4 CIDR"},
		{name: "empty", entry: "", wantErr: "empty entry"},
		{name: "numeric last label", entry: "host.123", wantErr: "last label is not all digits"},
		{name: "too long entry", entry: strings.Repeat("a.", 130) + "com", wantErr: "longer than 260 bytes"},

		// Wildcards.
		{name: "wildcard", entry: "*.example.org"},
		{name: "wildcard of a tld", entry: "*.com"},
		{name: "wildcard with port", entry: "*.example.org:443"},
		{name: "wildcard upper case trailing dot", entry: "*.Example.ORG."},
		{name: "wildcard alone", entry: "*", wantErr: `a wildcard is "*." followed by a name`},
		{name: "wildcard dot alone", entry: "*.", wantErr: `"*." must be followed by a name`},
		{name: "wildcard inside", entry: "a.*.b", wantErr: `a wildcard is "*."`},
		{name: "double star", entry: "**.x", wantErr: `a wildcard is "*."`},
		{name: "two wildcards", entry: "*.*.x", wantErr: `a wildcard is "*."`},
		{name: "star in label", entry: "*x.com", wantErr: `a wildcard is "*."`},
		{name: "star suffix", entry: "x.*", wantErr: `a wildcard is "*."`},
		{name: "wildcard of an address", entry: "*.1.2.3.4", wantErr: "last label is not all digits"},
		{name: "wildcard with bad port", entry: "*.x.com:0", wantErr: "port"},

		// Addresses and CIDRs.
		{name: "address", entry: "203.0.113.9"},
		{name: "address with port", entry: "198.51.100.7:5432"},
		{name: "private address", entry: "10.1.2.3"},
		{name: "cidr", entry: "203.0.113.0/24"},
		{name: "cidr not canonical", entry: "10.1.2.3/8"},
		{name: "cidr with port", entry: "203.0.113.0/24:443"},
		{name: "cidr everything", entry: "0.0.0.0/0"},
		{name: "cidr host", entry: "169.254.169.254/32"},
		{name: "cidr 33", entry: "10.0.0.0/33", wantErr: "not a valid IPv4 CIDR"},
		{name: "cidr no bits", entry: "10.0.0.0/", wantErr: "not a valid IPv4 CIDR"},
		{name: "cidr negative", entry: "10.0.0.0/-1", wantErr: "not a valid IPv4 CIDR"},
		{name: "cidr of a name", entry: "example.com/24", wantErr: "not a valid IPv4 CIDR"},
		{name: "octet 256", entry: "1.2.3.256", wantErr: "not a valid IPv4 address"},
		{name: "three octets", entry: "1.2.3", wantErr: "not a valid IPv4 address"},
		{name: "leading zero octet", entry: "010.1.2.3", wantErr: "not a valid IPv4 address"},
		{name: "address trailing dot", entry: "1.2.3.4.", wantErr: "not a valid IPv4 address"},
		{name: "bare number", entry: "3232235777", wantErr: "not a valid IPv4 address"},

		// IPv6.
		{name: "ipv6 loopback", entry: "::1", wantErr: "IPv6 is not supported"},
		{name: "ipv6 bracketed with port", entry: "[::1]:443", wantErr: "IPv6 is not supported"},
		{name: "ipv6 bracketed", entry: "[2001:db8::1]", wantErr: "IPv6 is not supported"},
		{name: "ipv6 cidr", entry: "2001:db8::/32", wantErr: "IPv6 is not supported"},
		{name: "ipv4-mapped ipv6", entry: "::ffff:169.254.169.254", wantErr: "IPv6 is not supported"},
		{name: "ipv6 link-local zone", entry: "fe80::1%eth0", wantErr: "IPv6 is not supported"},
		{name: "two colons, not ipv6", entry: "a.com:80:80", wantErr: "not a name, IPv4 address"},
		{name: "bracketed ipv4", entry: "[1.2.3.4]:80", wantErr: "not a name, IPv4 address"},

		// Ports.
		{name: "port 1", entry: "example.com:1"},
		{name: "port 65535", entry: "example.com:65535"},
		{name: "port 0", entry: "example.com:0", wantErr: `port "0"`},
		{name: "port 65536", entry: "example.com:65536", wantErr: `port "65536"`},
		{name: "port 99999", entry: "example.com:99999", wantErr: "port"},
		{name: "port 6 digits", entry: "example.com:100000", wantErr: "port"},
		{name: "port empty", entry: "example.com:", wantErr: `port ""`},
		{name: "port name", entry: "example.com:https", wantErr: "port"},
		{name: "port leading zero", entry: "example.com:0443", wantErr: "port"},
		{name: "port sign", entry: "example.com:+443", wantErr: "port"},
		{name: "port space", entry: "example.com: 443", wantErr: "port"},
		{name: "port without host", entry: ":443", wantErr: "empty name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, field := range []string{"allow", "deny"} {
				p := Policy{Allow: []string{"ok.example"}, Deny: []string{"ok.example"}}
				if field == "allow" {
					p.Allow = append(p.Allow, tt.entry)
				} else {
					p.Deny = append(p.Deny, tt.entry)
				}
				err := p.Validate()
				if tt.wantErr == "" {
					if err != nil {
						t.Errorf("%s entry %q: %v", field, tt.entry, err)
					}
					continue
				}
				prefix := fmt.Sprintf("network.%s[1] %s: ", field, quote(tt.entry))
				if !errors.Is(err, errdefs.ErrInvalid) || !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("%s entry %q: error %v, want ErrInvalid starting %q and containing %q", field, tt.entry, err, prefix, tt.wantErr)
				}
			}
		})
	}
}

// longName returns a valid DNS name of exactly n bytes.
func longName(n int) string {
	var b strings.Builder
	for b.Len() < n {
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		label := min(63, n-b.Len())
		b.WriteString(strings.Repeat("a", label))
	}
	s := b.String()
	if strings.HasSuffix(s, ".") { // a label of 0: lengthen the one before
		s = s[:len(s)-2] + "aa"
	}
	return s
}

func TestLongName(t *testing.T) {
	for _, n := range []int{1, 63, 64, 65, 127, 128, 253, 254} {
		if s := longName(n); len(s) != n || strings.Contains(s, "..") || strings.HasSuffix(s, ".") {
			t.Errorf("longName(%d) = %q (%d bytes)", n, s, len(s))
		}
	}
}

func TestValidateLimits(t *testing.T) {
	list := func(n int) []string {
		l := make([]string, n)
		for i := range l {
			l[i] = fmt.Sprintf("h%d.example", i)
		}
		return l
	}
	creds := func(n int) []Credential {
		c := make([]Credential, n)
		for i := range c {
			c[i] = Credential{Host: fmt.Sprintf("h%d.example", i), Header: "Authorization", Secret: "s"}
		}
		return c
	}
	tests := []struct {
		name    string
		p       Policy
		wantErr string
	}{
		{name: "256 allow entries", p: Policy{Allow: list(256)}},
		{name: "257 allow entries", p: Policy{Allow: list(257)}, wantErr: "network.allow: 257 entries, more than 256"},
		{name: "256 deny entries", p: Policy{Deny: list(256)}},
		{name: "257 deny entries", p: Policy{Deny: list(257)}, wantErr: "network.deny: 257 entries, more than 256"},
		{name: "64 credentials", p: Policy{Credentials: creds(64)}},
		{name: "65 credentials", p: Policy{Credentials: creds(65)}, wantErr: "network.credentials: 65 entries, more than 64"},
		{name: "260 byte entry", p: Policy{Allow: []string{"*." + longName(252) + ":65535"}}},
		{name: "261 byte entry", p: Policy{Allow: []string{"*." + longName(253) + ":65535"}}, wantErr: "longer than 260 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want ErrInvalid containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestValidateCredentials(t *testing.T) {
	ok := Credential{Host: "api.example.com", Header: "Authorization", Secret: "openai", Format: "Bearer {}"}
	with := func(f func(*Credential)) Credential {
		c := ok
		f(&c)
		return c
	}
	tests := []struct {
		name    string
		creds   []Credential
		wantErr string
	}{
		{name: "valid", creds: []Credential{ok}},
		{name: "no format", creds: []Credential{with(func(c *Credential) { c.Format = "" })}},
		{name: "format twice", creds: []Credential{with(func(c *Credential) { c.Format = "{}:{}" })}},
		{name: "format with tab", creds: []Credential{with(func(c *Credential) { c.Format = "Bearer\t{}" })}},
		{name: "format of 4096", creds: []Credential{with(func(c *Credential) { c.Format = "{}" + strings.Repeat("x", 4094) })}},
		{name: "host upper case trailing dot", creds: []Credential{with(func(c *Credential) { c.Host = "API.example.com." })}},
		{name: "single label host", creds: []Credential{with(func(c *Credential) { c.Host = "intranet" })}},
		{name: "header token chars", creds: []Credential{with(func(c *Credential) { c.Header = "X-Api_Key.v2!#$%&'*+^`|~" })}},
		{name: "header of 128", creds: []Credential{with(func(c *Credential) { c.Header = strings.Repeat("X", 128) })}},
		{name: "secret chars", creds: []Credential{with(func(c *Credential) { c.Secret = "Open_AI-key.2" })}},
		{name: "secret of 64", creds: []Credential{with(func(c *Credential) { c.Secret = strings.Repeat("s", 64) })}},
		{
			name:  "same host other headers",
			creds: []Credential{ok, with(func(c *Credential) { c.Header = "X-Org" })},
		},
		{
			name:  "same header other hosts",
			creds: []Credential{ok, with(func(c *Credential) { c.Host = "other.example.com" })},
		},

		{name: "wildcard host", creds: []Credential{with(func(c *Credential) { c.Host = "*.example.com" })}, wantErr: `network.credentials[0].host "*.example.com": must be an exact name`},
		{name: "ip host", creds: []Credential{with(func(c *Credential) { c.Host = "203.0.113.9" })}, wantErr: "must be an exact name"},
		{name: "host with port", creds: []Credential{with(func(c *Credential) { c.Host = "api.example.com:443" })}, wantErr: "must be an exact name"},
		{name: "ipv6 host", creds: []Credential{with(func(c *Credential) { c.Host = "[::1]" })}, wantErr: "must be an exact name"},
		{name: "empty host", creds: []Credential{with(func(c *Credential) { c.Host = "" })}, wantErr: ".host \"\": empty name"},
		{name: "bad host", creds: []Credential{with(func(c *Credential) { c.Host = "a_b.com" })}, wantErr: "is not allowed in a name"},
		{name: "empty header", creds: []Credential{with(func(c *Credential) { c.Header = "" })}, wantErr: `network.credentials[0].header "": must be 1 to 128 bytes`},
		{name: "header of 129", creds: []Credential{with(func(c *Credential) { c.Header = strings.Repeat("X", 129) })}, wantErr: "must be 1 to 128 bytes"},
		{name: "header with colon", creds: []Credential{with(func(c *Credential) { c.Header = "X-A:" })}, wantErr: "not a valid HTTP header name"},
		{name: "header with space", creds: []Credential{with(func(c *Credential) { c.Header = "X A" })}, wantErr: "not a valid HTTP header name"},
		{name: "header with CRLF", creds: []Credential{with(func(c *Credential) { c.Header = "X-A\r\nEvil" })}, wantErr: "not a valid HTTP header name"},
		{name: "pseudo header", creds: []Credential{with(func(c *Credential) { c.Header = ":authority" })}, wantErr: "not a valid HTTP header name"},
		{name: "header Host", creds: []Credential{with(func(c *Credential) { c.Header = "host" })}, wantErr: "frames the request"},
		{name: "header Content-Length", creds: []Credential{with(func(c *Credential) { c.Header = "Content-Length" })}, wantErr: "frames the request"},
		{name: "header Transfer-Encoding", creds: []Credential{with(func(c *Credential) { c.Header = "TRANSFER-ENCODING" })}, wantErr: "frames the request"},
		{name: "header Connection", creds: []Credential{with(func(c *Credential) { c.Header = "Connection" })}, wantErr: "frames the request"},
		{name: "empty secret", creds: []Credential{with(func(c *Credential) { c.Secret = "" })}, wantErr: `network.credentials[0].secret ""`},
		{name: "secret with slash", creds: []Credential{with(func(c *Credential) { c.Secret = "a/b" })}, wantErr: ".secret \"a/b\": must be 1 to 64"},
		{name: "secret with space", creds: []Credential{with(func(c *Credential) { c.Secret = "a b" })}, wantErr: ".secret"},
		{name: "secret of 65", creds: []Credential{with(func(c *Credential) { c.Secret = strings.Repeat("s", 65) })}, wantErr: ".secret"},
		{name: "format without placeholder", creds: []Credential{with(func(c *Credential) { c.Format = "Bearer" })}, wantErr: `network.credentials[0].format: must contain "{}"`},
		{name: "format with CR", creds: []Credential{with(func(c *Credential) { c.Format = "Bearer {}\r" })}, wantErr: "control character"},
		{name: "format with LF", creds: []Credential{with(func(c *Credential) { c.Format = "{}\nX-Evil: 1" })}, wantErr: "control character"},
		{name: "format with NUL", creds: []Credential{with(func(c *Credential) { c.Format = "{}\x00" })}, wantErr: "control character"},
		{name: "format with DEL", creds: []Credential{with(func(c *Credential) { c.Format = "{}\x7f" })}, wantErr: "control character"},
		{name: "format not utf-8", creds: []Credential{with(func(c *Credential) { c.Format = "{}\xff" })}, wantErr: "not valid UTF-8"},
		{name: "format of 4097", creds: []Credential{with(func(c *Credential) { c.Format = "{}" + strings.Repeat("x", 4095) })}, wantErr: "longer than 4096 bytes"},
		{
			name:    "same host and header",
			creds:   []Credential{ok, with(func(c *Credential) { c.Secret = "other" })},
			wantErr: "network.credentials[1]: same host and header as network.credentials[0]",
		},
		{
			name: "same host and header in other spellings",
			creds: []Credential{ok, with(func(c *Credential) {
				c.Host, c.Header = "API.Example.com.", "authorization"
			})},
			wantErr: "network.credentials[1]: same host and header as network.credentials[0]",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Policy{Credentials: tt.creds}.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want ErrInvalid containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestValidateNamesEveryProblem(t *testing.T) {
	p := Policy{
		Egress: "sometimes",
		Allow:  []string{"ok.com", "a..b", "::1"},
		Deny:   []string{"*"},
	}
	err := p.Validate()
	want := `network.egress "sometimes": must be "allow" or "deny"; ` +
		`network.allow[1] "a..b": empty label in name; ` +
		`network.allow[2] "::1": IPv6 is not supported; ` +
		`network.deny[0] "*": a wildcard is "*." followed by a name: invalid argument`
	if err == nil || err.Error() != want {
		t.Fatalf("error\n%v\nwant\n%s", err, want)
	}

	many := Policy{Allow: make([]string, 25)} // 25 empty entries
	err = many.Validate()
	if err == nil || !strings.Contains(err.Error(), "network.allow[9]") || strings.Contains(err.Error(), "network.allow[10]") ||
		!strings.HasSuffix(err.Error(), "; and 15 more: invalid argument") {
		t.Fatalf("error %v, want ten problems and a count of the rest", err)
	}

	long := Policy{Allow: []string{strings.Repeat("x", 300)}}
	if err := long.Validate(); err == nil || len(err.Error()) > 200 {
		t.Fatalf("error %v, want the long entry quoted short", err)
	}
}

func TestNormalized(t *testing.T) {
	tests := []struct {
		name string
		p    Policy
		want Policy
	}{
		{name: "zero", p: Policy{}, want: Policy{Egress: "deny"}},
		{name: "egress allow kept", p: Policy{Egress: "allow"}, want: Policy{Egress: "allow"}},
		{name: "empty lists become nil", p: Policy{Allow: []string{}, Deny: []string{}, Credentials: []Credential{}}, want: Policy{Egress: "deny"}},
		{
			name: "names lower case without trailing dot",
			p:    Policy{Allow: []string{"Example.COM.", "*.Example.org.:443", "LOCALHOST"}, Deny: []string{"Evil.Example.Org."}},
			want: Policy{Egress: "deny", Allow: []string{"example.com", "*.example.org:443", "localhost"}, Deny: []string{"evil.example.org"}},
		},
		{
			name: "addresses and cidrs as written",
			p:    Policy{Allow: []string{"10.1.2.3/8", "203.0.113.9:80"}},
			want: Policy{Egress: "deny", Allow: []string{"10.1.2.3/8", "203.0.113.9:80"}},
		},
		{
			name: "credential host and default format",
			p:    Policy{Credentials: []Credential{{Host: "API.Example.com.", Header: "authorization", Secret: "k"}}},
			want: Policy{Egress: "deny", Credentials: []Credential{{Host: "api.example.com", Header: "authorization", Secret: "k", Format: "{}"}}},
		},
		{
			name: "invalid entries kept",
			p:    Policy{Allow: []string{"A..B", "[::1]"}},
			want: Policy{Egress: "deny", Allow: []string{"A..B", "[::1]"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			orig := clonePolicy(tt.p)
			got := tt.p.Normalized()
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Normalized() = %+v, want %+v", got, tt.want)
			}
			if again := got.Normalized(); !reflect.DeepEqual(again, got) {
				t.Errorf("Normalized() twice = %+v, want %+v", again, got)
			}
			if !reflect.DeepEqual(tt.p, orig) {
				t.Errorf("Normalized() changed its receiver: %+v, was %+v", tt.p, orig)
			}
		})
	}
}

func clonePolicy(p Policy) Policy {
	c := p
	if p.Allow != nil {
		c.Allow = append([]string{}, p.Allow...)
	}
	if p.Deny != nil {
		c.Deny = append([]string{}, p.Deny...)
	}
	if p.Credentials != nil {
		c.Credentials = append([]Credential{}, p.Credentials...)
	}
	return c
}

func TestSecrets(t *testing.T) {
	tests := []struct {
		name  string
		creds []Credential
		want  []string
	}{
		{name: "none", want: nil},
		{name: "one", creds: []Credential{{Secret: "openai"}}, want: []string{"openai"}},
		{
			name:  "sorted and unique",
			creds: []Credential{{Secret: "zeta"}, {Secret: "alpha"}, {Secret: "zeta"}, {Secret: "beta"}, {Secret: "alpha"}},
			want:  []string{"alpha", "beta", "zeta"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := (Policy{Credentials: tt.creds}).Secrets(); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Secrets() = %q, want %q", got, tt.want)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"", "null", "{}", apiExample,
		`{"egress":"allow","deny":["Evil.COM.","10.1.2.3/8:22","*.x.y"]}`,
		`{"allow":["[::1]:443","a.*.b","1.2.3.4:0","localhost."]}`,
		`{"credentials":[{"host":"A.b.","header":"X-Key","secret":"s.1","format":""}]}`,
		`{"EGRESS":"deny","Allow":["x.com"]}`,
		`{"allow":["x.com"]} trailing`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		p, err := Parse(raw)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("Parse error %v is not ErrInvalid", err)
			}
			return
		}
		n := p.Normalized()
		if err := n.Validate(); err != nil {
			t.Fatalf("normalized policy %+v does not validate: %v", n, err)
		}
		if again := n.Normalized(); !reflect.DeepEqual(again, n) {
			t.Fatalf("Normalized not idempotent: %+v then %+v", n, again)
		}
		for _, q := range []Policy{p, n} {
			b, err := json.Marshal(q)
			if err != nil {
				t.Fatalf("marshal %+v: %v", q, err)
			}
			back, err := Parse(b)
			if err != nil {
				t.Fatalf("Parse(%s) of a valid policy: %v", b, err)
			}
			if got := back.Normalized(); !reflect.DeepEqual(got, n) {
				t.Fatalf("round trip of %s: normalized %+v, want %+v", b, got, n)
			}
		}
		if _, err := Compile(p, Bounds{Gateway: gatewayAddr}); err != nil {
			t.Fatalf("Compile of a valid policy: %v", err)
		}
	})
}
