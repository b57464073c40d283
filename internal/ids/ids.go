// Package ids makes the random IDs and secrets of airlock's resources. Both
// are lowercase letters and digits, so an ID is safe as a DNS label, a
// file name and a hostname.
package ids

import (
	"crypto/rand"
	"crypto/sha256"
	"strings"
)

// New returns prefix followed by 20 random characters (100 bits).
func New(prefix string) string {
	return prefix + strings.ToLower(rand.Text())[:20]
}

// Secret returns 52 random characters (260 bits), for API keys and attach
// tokens.
func Secret() string {
	return strings.ToLower(rand.Text() + rand.Text())
}

// SecretHash is what the store keeps of a secret (an API key's, an attach
// token's): its sha256, to be compared in constant time.
func SecretHash(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}
