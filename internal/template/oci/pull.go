package oci

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// PullOptions says how Pull may reach a registry.
type PullOptions struct {
	// Username and Password authenticate to the registry (HTTP basic, or
	// the registry's token exchange when it asks for one). When both are
	// empty the pull is anonymous, unless HostCredentials.
	Username string
	Password string
	// HostCredentials, when Username and Password are empty, takes
	// credentials from the host's docker config ($DOCKER_CONFIG,
	// ~/.docker/config.json, credential helpers) for the registries it
	// names (airlock serve --registry-host-credentials). Off, the host's
	// credentials are never read: a tenant naming a registry would
	// otherwise pull with the operator's account.
	HostCredentials bool
	// Trusted, if not empty, lists the registries (host or host:port, as
	// in the reference) a pull may use; "docker.io" stands for Docker
	// Hub. A reference to any other registry is refused before any
	// network access. A registry listed here may be at a loopback or
	// private address, which no other may (see registryGuard).
	Trusted []string
	// Insecure allows plain HTTP, tried when HTTPS fails, to any
	// registry. Without it plain HTTP is allowed only to registries on
	// loopback addresses (127.0.0.0/8, ::1) and localhost, and is refused
	// everywhere else, redirects included.
	Insecure bool
}

// Pull resolves ref, an image reference such as
// "registry.example.com/team/img:tag" or "...@sha256:<hex>", and returns its
// linux/amd64 image and that image's manifest digest ("sha256:<hex>"). A
// reference without a registry means Docker Hub, one without a tag means
// "latest". From an index Pull picks the linux/amd64 image; an index without
// one, or an image whose config names another platform, is
// errdefs.ErrInvalid naming the platforms found.
//
// Errors: a malformed ref or untrusted registry (ErrInvalid,
// ErrPermission), an unknown repository, tag or digest (ErrNotFound),
// credentials refused (ErrUnauthenticated), a registry unreachable or
// failing (ErrUnavailable).
//
// Only the manifest and config are fetched here; layers are fetched as
// Flatten reads them, still under ctx, so ctx must outlive that use of
// the image.
func Pull(ctx context.Context, ref string, opts PullOptions) (Image, string, error) {
	r, err := parseRef(ref, opts.Trusted, opts.Insecure)
	if err != nil {
		return nil, "", fmt.Errorf("pull %s: %w", ref, err)
	}
	reg := r.Context().Registry

	remoteOpts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithTransport(newRegistryGuard(reg, opts.Trusted, opts.Insecure)),
	}
	authDesc := "no credentials"
	var secrets []string
	switch {
	case opts.Username != "" || opts.Password != "":
		remoteOpts = append(remoteOpts, remote.WithAuth(&authn.Basic{Username: opts.Username, Password: opts.Password}))
		authDesc, secrets = fmt.Sprintf("user %q", opts.Username), []string{opts.Password}
	case opts.HostCredentials:
		remoteOpts = append(remoteOpts, remote.WithAuthFromKeychain(authn.DefaultKeychain))
		authDesc = "the host's docker config (none if it has no entry for the registry)"
		if a, err := authn.DefaultKeychain.Resolve(reg); err == nil {
			if c, err := a.Authorization(); err == nil {
				secrets = []string{c.Password, c.Auth, c.IdentityToken, c.RegistryToken}
			}
		}
	}
	fail := func(err error) (Image, string, error) {
		return nil, "", fmt.Errorf("pull %s: %w", ref, registryError(ctx, reg.RegistryStr(), authDesc, err, secrets...))
	}

	desc, err := remote.Get(r, remoteOpts...)
	if err != nil {
		return fail(err)
	}
	switch {
	case desc.MediaType.IsIndex():
		idx, err := desc.ImageIndex()
		if err != nil {
			return fail(err)
		}
		img, h, err := pickImage(idx, ref)
		if err != nil {
			return nil, "", registryError(ctx, reg.RegistryStr(), authDesc, err, secrets...) // it names the image
		}
		return img, h.String(), nil
	case desc.MediaType.IsSchema1():
		return nil, "", fmt.Errorf("pull %s: Docker schema 1 manifests are not supported; push the image again with a current docker: %w", ref, errdefs.ErrInvalid)
	case desc.MediaType.IsImage():
		img, err := desc.Image()
		if err != nil {
			return fail(err)
		}
		if err := checkPlatform(img, ref); err != nil {
			return nil, "", registryError(ctx, reg.RegistryStr(), authDesc, err, secrets...) // it names the image
		}
		return img, desc.Digest.String(), nil
	default:
		return nil, "", fmt.Errorf("pull %s: %s is not an image manifest: %w", ref, desc.MediaType, errdefs.ErrInvalid)
	}
}

// CheckRef checks, without any network access, that Pull could be asked
// for ref with the given trusted registries: a malformed ref is
// errdefs.ErrInvalid, one whose registry is not trusted
// errdefs.ErrPermission.
func CheckRef(ref string, trusted []string) error {
	if _, err := parseRef(ref, trusted, false); err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	return nil
}

// parseRef parses ref and checks its registry against trusted. The
// reference allows plain HTTP if insecure or its registry is on loopback.
func parseRef(ref string, trusted []string, insecure bool) (name.Reference, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("not an image reference: %v: %w", err, errdefs.ErrInvalid)
	}
	if err := checkTrusted(r.Context().Registry, trusted); err != nil {
		return nil, err
	}
	if insecure || isLoopback(r.Context().RegistryStr()) {
		if r, err = name.ParseReference(ref, name.Insecure); err != nil {
			return nil, fmt.Errorf("not an image reference: %v: %w", err, errdefs.ErrInvalid)
		}
	}
	return r, nil
}

// isLoopback reports whether host, a host[:port], is localhost or a
// loopback address.
func isLoopback(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkTrusted fails with errdefs.ErrPermission unless trusted is empty or
// lists reg.
func checkTrusted(reg name.Registry, trusted []string) error {
	if len(trusted) == 0 {
		return nil
	}
	for _, t := range trusted {
		tr, err := name.NewRegistry(t)
		if err != nil {
			return fmt.Errorf("trusted registry %q is not host[:port]: %w", t, errdefs.ErrInvalid)
		}
		if strings.EqualFold(tr.RegistryStr(), reg.RegistryStr()) {
			return nil
		}
	}
	return fmt.Errorf("registry %s is not trusted (trusted: %s): %w",
		reg.RegistryStr(), strings.Join(trusted, ", "), errdefs.ErrPermission)
}

// registryError classifies an error from talking to a registry. host is the
// registry's, or empty to take it from the error; auth says which
// credentials were used; secrets are those credentials, never to be
// repeated. Errors already carrying a class, and those that are not about
// the registry, pass through. What the registry wrote is kept to one
// cleaned line (registryMessage, cleanLine).
func registryError(ctx context.Context, host, auth string, err error, secrets ...string) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		if errors.Is(err, ctxErr) {
			return err
		}
		return fmt.Errorf("%s: %w", cleanLine(err.Error(), secrets...), ctxErr)
	}
	for _, class := range []error{errdefs.ErrInvalid, errdefs.ErrNotFound, errdefs.ErrUnauthenticated,
		errdefs.ErrPermission, errdefs.ErrUnavailable, errdefs.ErrTooLarge} {
		if errors.Is(err, class) {
			return err
		}
	}
	var te *transport.Error
	if errors.As(err, &te) {
		if host == "" && te.Request != nil && te.Request.URL != nil {
			host = te.Request.URL.Host
		}
		msg := registryMessage(te, secrets...)
		switch {
		case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden ||
			hasCode(te, transport.UnauthorizedErrorCode, transport.DeniedErrorCode):
			if auth == "" {
				auth = "the credentials given"
			}
			return fmt.Errorf("registry %s refused access with %s; check registry_auth: %s: %w",
				host, auth, msg, errdefs.ErrUnauthenticated)
		case te.StatusCode == http.StatusNotFound ||
			hasCode(te, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode):
			return fmt.Errorf("registry %s: %s: %w", host, msg, errdefs.ErrNotFound)
		case te.StatusCode == http.StatusTooManyRequests || te.StatusCode >= 500 || te.Temporary():
			return fmt.Errorf("registry %s: %s: %w", host, msg, errdefs.ErrUnavailable)
		}
		return fmt.Errorf("registry %s: %s", host, msg)
	}
	var ue *url.Error
	var ne net.Error
	if errors.As(err, &ue) || errors.As(err, &ne) {
		if host == "" && ue != nil {
			if u, perr := url.Parse(ue.URL); perr == nil {
				host = u.Host
			}
		}
		return fmt.Errorf("registry %s is unreachable: %s: %w", host, cleanLine(err.Error(), secrets...), errdefs.ErrUnavailable)
	}
	return err
}

// hasCode reports whether te carries any of codes.
func hasCode(te *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range te.Errors {
		for _, c := range codes {
			if d.Code == c {
				return true
			}
		}
	}
	return false
}
