// Package secrets seals the values of stored secrets with AES-256-GCM under
// one key kept in a file ($AIRLOCK_HOME/secrets.key), so that the database
// alone (a copy, a backup) reveals no value. The owner and name of a secret
// are bound to its sealed value as additional data: a sealed value copied
// to another row does not open.
//
// A sealed value is 1 version byte (1), a 12-byte random nonce and the
// ciphertext with its 16-byte tag.
//
// LoadOrCreateKey is the key-file handling on its own, for the server's
// other keys (such as the one that signs E2B access tokens).
package secrets

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// KeySize is the size of the key in the key file: AES-256.
const KeySize = 32

const (
	version   = 1
	nonceSize = 12
	overhead  = 1 + nonceSize + 16 // version, nonce, GCM tag
)

// Box seals and opens secret values under one key. It is safe for
// concurrent use: it holds no state beyond the key.
type Box struct {
	aead   cipher.AEAD
	macKey []byte // for MAC: derived from the key, never the key itself
}

// OpenBox loads the key in the file at path, creating the file (mode 0600,
// its directory 0700 if missing) with a fresh random key when there is
// none. A key file that is not a regular file of KeySize bytes, or that
// others than its owner may read or write, is refused with an error wrapping
// errdefs.ErrPrecondition that says what to do.
func OpenBox(path string) (*Box, error) {
	key, err := LoadOrCreateKey(path, KeySize)
	if err != nil {
		return nil, err
	}
	return newBox(key)
}

// LoadOrCreateKey returns the n-byte key in the file at path, creating the
// file (mode 0600, its directory 0700 if missing) with n fresh random bytes
// when there is none; two processes creating it at once get the same key.
// A key file that is not a regular file of n bytes, or that others than its
// owner may read or write, is refused with an error wrapping
// errdefs.ErrPrecondition that says what to do.
func LoadOrCreateKey(path string, n int) ([]byte, error) {
	if n < 1 {
		return nil, fmt.Errorf("key file %s: a key of %d bytes: %w", path, n, errdefs.ErrInvalid)
	}
	key, err := readKey(path, n)
	if errors.Is(err, fs.ErrNotExist) {
		key, err = createKey(path, n)
	}
	return key, err
}

func newBox(key []byte) (*Box, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("airlock secrets: mac key"))
	return &Box{aead: aead, macKey: mac.Sum(nil)}, nil
}

// MAC returns a keyed digest of data (HMAC-SHA256 under a key derived from
// the box's): a fingerprint of a request that may hold a secret, which
// cannot be tested against guesses without the key file.
func (b *Box) MAC(data []byte) []byte {
	mac := hmac.New(sha256.New, b.macKey)
	mac.Write(data)
	return mac.Sum(nil)
}

// readKey reads and checks an existing key file of n bytes.
func readKey(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("key file %s is not a regular file: move it away"+
			" (what was sealed or signed under the old key does not work with a new one): %w",
			path, errdefs.ErrPrecondition)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("key file %s has mode %04o, so other users may read it: run `chmod 600 %s`: %w",
			path, perm, path, errdefs.ErrPrecondition)
	}
	key, err := io.ReadAll(io.LimitReader(f, int64(n)+1))
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	if len(key) != n {
		size := int64(len(key))
		if len(key) > n { // only n+1 bytes were read
			size = max(size, fi.Size())
		}
		return nil, fmt.Errorf("key file %s holds %d bytes, not %d: restore it from a backup"+
			" (removing it makes a new key, and what was sealed or signed under the old one stops working): %w",
			path, size, n, errdefs.ErrPrecondition)
	}
	return key, nil
}

// createKey writes a fresh key of n bytes to path unless a key file appears
// there first, and returns the key in the file. The key is written to a temporary
// file and hard-linked into place, which fails if path exists: two
// processes starting at once end up with the same key, where a rename (as
// internal/atomicfile does) would let the second replace a key the first
// may already have sealed with.
func createKey(path string, n int) ([]byte, error) {
	key := make([]byte, n)
	rand.Read(key)
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create key file %s: %w", path, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-") // mode 0600
	if err != nil {
		return nil, fmt.Errorf("create key file %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	_, err = f.Write(key)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("create key file %s: %w", path, err)
	}
	if err := os.Link(tmp, path); errors.Is(err, fs.ErrExist) {
		return readKey(path, n)
	} else if err != nil {
		return nil, fmt.Errorf("create key file %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return key, nil
}

// additionalData binds a sealed value to its row: the version, then owner
// and name, each with its length first so that no two pairs read the same.
func additionalData(owner, name string) []byte {
	ad := []byte("airlock secret")
	ad = append(ad, version)
	ad = binary.AppendUvarint(ad, uint64(len(owner)))
	ad = append(ad, owner...)
	ad = binary.AppendUvarint(ad, uint64(len(name)))
	return append(ad, name...)
}

// Seal encrypts the value of the secret name of owner.
func (b *Box) Seal(owner, name string, value []byte) ([]byte, error) {
	out := make([]byte, 1+nonceSize, overhead+len(value))
	out[0] = version
	rand.Read(out[1:])
	return b.aead.Seal(out, out[1:1+nonceSize], value, additionalData(owner, name)), nil
}

// Open decrypts what Seal returned for the same owner and name. A value
// that was changed, sealed for another owner or name, or under another key
// does not open. The error never holds the value.
func (b *Box) Open(owner, name string, sealed []byte) ([]byte, error) {
	if len(sealed) < overhead {
		return nil, fmt.Errorf("open secret %s: the sealed value is %d bytes, too short to be one", name, len(sealed))
	}
	if sealed[0] != version {
		return nil, fmt.Errorf("open secret %s: sealed with format %d, which this airlock does not know: upgrade airlock", name, sealed[0])
	}
	value, err := b.aead.Open(nil, sealed[1:1+nonceSize], sealed[1+nonceSize:], additionalData(owner, name))
	if err != nil {
		return nil, fmt.Errorf("open secret %s: it does not open under this secrets key"+
			" (changed, moved from another secret, or sealed under another key)", name)
	}
	return value, nil
}
