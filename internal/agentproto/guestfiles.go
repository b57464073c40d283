package agentproto

// Files that init writes into the sandbox's root filesystem for that
// sandbox alone: its hostname, its resolver, its gateway's CA. They are
// named here because both ends need them: the agent writes them, and the
// host takes them out again of a disk image it saves from a sandbox, so
// that a template made of it carries none of them.
const (
	// HostnameFile holds the sandbox's hostname and a newline.
	HostnameFile = "/etc/hostname"
	// HostsFile gains HostsLine for the hostname. It is created, with
	// HostsHeader first, when the image has none or an empty one.
	HostsFile = "/etc/hosts"
	// HostsHeader is what a hosts file the agent creates starts with.
	HostsHeader = "127.0.0.1 localhost\n::1 localhost\n"
	// ResolvConfFile is replaced by ResolvConf (a symlink there is
	// replaced by a file).
	ResolvConfFile = "/etc/resolv.conf"
	// CACertFile is the gateway's CA in a file of its own, where
	// update-ca-certificates finds it. It is written only when its
	// directory exists, that is when the image has that tool's layout.
	CACertFile = "/usr/local/share/ca-certificates/airlock-gateway.crt"
)

// HostsLine is the line of HostsFile that resolves hostname.
func HostsLine(hostname string) string { return "127.0.1.1 " + hostname + "\n" }

// ResolvConf is the content of ResolvConfFile: the gateway as the only
// resolver.
func ResolvConf(gateway string) string {
	return "nameserver " + gateway + "\noptions edns0\n"
}

// CABundles are where images keep the bundle of CA certificates that
// OpenSSL, Go, curl and others trust, in the order they are looked for:
// Debian, Ubuntu and Alpine; Fedora and RHEL; openSUSE; others. The agent
// appends the gateway's CA to the first that exists as a file (following
// symlinks), or creates the first when none does.
func CABundles() []string {
	return []string{
		"/etc/ssl/certs/ca-certificates.crt",
		"/etc/pki/tls/certs/ca-bundle.crt",
		"/etc/ssl/ca-bundle.pem",
		"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
		"/etc/pki/tls/cacert.pem",
		"/etc/ssl/cert.pem",
	}
}

// ImageConfigFile is where a template built from an image or a
// Dockerfile keeps its configuration (ImageConfig, as JSON, among
// other fields the host reads). The agent reads it at init for the
// defaults of every command.
const ImageConfigFile = "/etc/airlock/image.json"

// ImageConfig is what the agent takes from ImageConfigFile: the
// environment, working directory and user of a command that does not
// name its own. A sandbox's own environment (InitRequest.Env) and a
// command's fields win over it.
type ImageConfig struct {
	// Env holds KEY=VALUE entries, as in an OCI image's configuration.
	Env []string `json:"env,omitempty"`
	// WorkingDir is used when it exists in the sandbox.
	WorkingDir string `json:"working_dir,omitempty"`
	// User is a name, or uid[:gid].
	User string `json:"user,omitempty"`
}
