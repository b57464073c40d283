// Package oci turns OCI and Docker images into directory trees for the
// template store. Pull fetches an image from a registry and OpenArchive reads
// one from an uploaded tar; either way only the linux/amd64 image is taken.
// ImageConfig keeps what a template needs from the image config, and Flatten
// applies the layers in order to an empty directory, which the template
// store then makes an ext4 image of.
package oci

import (
	"fmt"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// The one platform airlock runs.
const (
	wantOS   = "linux"
	wantArch = "amd64"
)

// Image is an image as go-containerregistry models it; its layers are
// read as they are used.
type Image = v1.Image

// maxIndexDepth bounds how deep indexes nested in indexes are searched.
const maxIndexDepth = 4

// Config is what a template keeps from an image config.
type Config struct {
	// Env holds the environment as KEY=value entries.
	Env []string
	// WorkingDir is the directory commands start in; empty means "/".
	WorkingDir string
	// User is the user commands run as, as the image gives it: a name or
	// uid, optionally with ":group". Empty means root.
	User string
	// Entrypoint and Cmd are the image's default command, exec form.
	Entrypoint []string
	Cmd        []string
}

// ImageConfig returns the settings a template keeps from img's config.
func ImageConfig(img Image) (Config, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return Config{}, fmt.Errorf("read image config: %w", err)
	}
	c := cf.Config
	return Config{
		Env:        slices.Clone(c.Env),
		WorkingDir: c.WorkingDir,
		User:       c.User,
		Entrypoint: slices.Clone(c.Entrypoint),
		Cmd:        slices.Clone(c.Cmd),
	}, nil
}

// checkPlatform fails unless img's config says linux/amd64 or says nothing.
func checkPlatform(img v1.Image, what string) error {
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("image %s: read config: %w", what, err)
	}
	if cf.OS == "" && cf.Architecture == "" {
		return nil
	}
	if cf.OS != wantOS || cf.Architecture != wantArch {
		return fmt.Errorf("image %s is %s only; airlock runs %s/%s: %w",
			what, platformString(cf.OS, cf.Architecture, cf.Variant), wantOS, wantArch, errdefs.ErrInvalid)
	}
	return nil
}

// pickImage returns the linux/amd64 image of idx, searching indexes nested
// in it, and that image's manifest digest. Entries without a platform are
// judged by their config. An image without a variant is preferred to one
// with a variant.
func pickImage(idx v1.ImageIndex, what string) (v1.Image, v1.Hash, error) {
	var found []string
	img, h, err := pickIn(idx, what, 0, &found)
	if err != nil {
		return nil, v1.Hash{}, err
	}
	if img == nil {
		if len(found) == 0 {
			return nil, v1.Hash{}, fmt.Errorf("image %s: the index lists no %s/%s image: %w", what, wantOS, wantArch, errdefs.ErrInvalid)
		}
		return nil, v1.Hash{}, fmt.Errorf("image %s is %s only; airlock runs %s/%s: %w",
			what, strings.Join(found, ", "), wantOS, wantArch, errdefs.ErrInvalid)
	}
	if err := checkPlatform(img, what); err != nil {
		return nil, v1.Hash{}, err
	}
	return img, h, nil
}

// pickIn searches idx for a linux/amd64 image, adding every other platform
// it meets to found. It returns a nil image if there is none.
func pickIn(idx v1.ImageIndex, what string, depth int, found *[]string) (v1.Image, v1.Hash, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, v1.Hash{}, fmt.Errorf("image %s: read index: %w", what, err)
	}
	var (
		best        *v1.Descriptor
		bestVariant string
	)
	for i := range m.Manifests {
		d := &m.Manifests[i]
		if d.MediaType.IsIndex() {
			if depth+1 >= maxIndexDepth {
				return nil, v1.Hash{}, fmt.Errorf("image %s: indexes nested more than %d deep: %w", what, maxIndexDepth, errdefs.ErrInvalid)
			}
			sub, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, v1.Hash{}, fmt.Errorf("image %s: read index %s: %w", what, d.Digest, err)
			}
			img, h, err := pickIn(sub, what, depth+1, found)
			if err != nil || img != nil {
				return img, h, err
			}
			continue
		}
		if !d.MediaType.IsImage() {
			continue
		}
		p := d.Platform
		if p == nil {
			img, err := idx.Image(d.Digest)
			if err != nil {
				return nil, v1.Hash{}, fmt.Errorf("image %s: read manifest %s: %w", what, d.Digest, err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				return nil, v1.Hash{}, fmt.Errorf("image %s: read config of %s: %w", what, d.Digest, err)
			}
			p = cf.Platform()
			if p == nil {
				p = &v1.Platform{}
			}
		}
		if p.OS == wantOS && p.Architecture == wantArch {
			if best == nil || bestVariant != "" && p.Variant == "" {
				best, bestVariant = d, p.Variant
			}
			continue
		}
		// Build attestations are listed as unknown/unknown; they are not images to run.
		if p.OS != "unknown" || p.Architecture != "unknown" {
			s := platformString(p.OS, p.Architecture, p.Variant)
			if !slices.Contains(*found, s) {
				*found = append(*found, s)
			}
		}
	}
	if best == nil {
		return nil, v1.Hash{}, nil
	}
	img, err := idx.Image(best.Digest)
	if err != nil {
		return nil, v1.Hash{}, fmt.Errorf("image %s: read manifest %s: %w", what, best.Digest, err)
	}
	return img, best.Digest, nil
}

// platformString formats a platform as os/arch[/variant], "unknown" for
// an empty part.
func platformString(os, arch, variant string) string {
	if os == "" {
		os = "unknown"
	}
	if arch == "" {
		arch = "unknown"
	}
	s := os + "/" + arch
	if variant != "" {
		s += "/" + variant
	}
	return s
}
