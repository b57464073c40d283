package service

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
)

// tokenKeySize is the least size of Config.TokenKey, and the size of the
// one the service makes when none is given.
const tokenKeySize = 32

// An envd access token reads "ea_" and the first 40 hex digits (160 bits)
// of HMAC-SHA256(Config.TokenKey, "envd-access:" + sandbox ID). E2B's SDKs
// send it to the sandbox's envd routes (header X-Access-Token); derived
// rather than stored, it is the same on every connect, and the sandbox ID
// alone does not give it away.
const (
	accessTokenPrefix = "ea_"
	accessTokenHex    = 40
)

// SandboxAccessToken returns the envd access token of sandbox id. It is
// the same for as long as the token key is, and differs between sandboxes.
// The sandbox is not looked up: the caller checks that p may see it.
func (s *Service) SandboxAccessToken(id string) string {
	if len(s.cfg.TokenKey) < tokenKeySize {
		panic("service: SandboxAccessToken on a Service not made by New")
	}
	mac := hmac.New(sha256.New, s.cfg.TokenKey)
	mac.Write([]byte("envd-access:" + id))
	return accessTokenPrefix + hex.EncodeToString(mac.Sum(nil))[:accessTokenHex]
}

// CheckSandboxAccessToken reports whether token is the envd access token
// of sandbox id, comparing in constant time.
func (s *Service) CheckSandboxAccessToken(id, token string) bool {
	if id == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(s.SandboxAccessToken(id)), []byte(token)) == 1
}
