// Package localkube runs a Kubernetes control plane on this host: etcd,
// kube-apiserver and, when asked, kube-scheduler, built by
// tools/kube/build.sh, on loopback ports, with their files in a directory
// of the caller's, one bearer token in group system:masters and one per
// named user, and kubectl (from the host) pointed at it through a
// kubeconfig of its own. The tests use it through internal/kubetest, and
// `airlock localcluster` for a cluster on one machine. Its etcd does not
// fsync: it is for tests, the bench and trying cluster mode, never for a
// cluster that matters.
package localkube

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/ids"
)

// ControlPlane is a running etcd and kube-apiserver.
type ControlPlane struct {
	// URL is the apiserver's address (https, a self-signed certificate).
	URL string
	// Token is the bearer token of an administrator.
	Token string
	// Kubeconfig is the path of a kubeconfig for URL and Token.
	Kubeconfig string
	dir        string
	bin        string
	tokens     map[string]string // the users' tokens, by user

	mu    sync.Mutex
	procs []*proc // in the order started
}

// proc is a component of the control plane.
type proc struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{}
}

// ErrNoBinaries says that bin lacks a component (tools/kube/build.sh
// builds them).
//
//lint:ignore ST1005 Kubernetes is a name
var ErrNoBinaries = errors.New("Kubernetes binaries missing")

// Check reports whether bin holds the components named (etcd,
// kube-apiserver, kube-scheduler) and kubectl is on PATH.
func Check(bin string, names ...string) error {
	for _, name := range names {
		if _, err := os.Stat(filepath.Join(bin, name)); bin == "" || err != nil {
			return fmt.Errorf("%w: no %s in %q: tools/kube/build.sh builds it and prints the directory: %w", ErrNoBinaries, name, bin, errdefs.ErrPrecondition)
		}
	}
	if _, err := exec.LookPath("kubectl"); err != nil {
		return fmt.Errorf("%w: no kubectl on PATH: %w", ErrNoBinaries, errdefs.ErrPrecondition)
	}
	return nil
}

// Start starts etcd and kube-apiserver from bin with their files in dir
// (which must exist) and waits until the apiserver is ready. Each of
// users ("system:serviceaccount:NS:NAME" for a service account) gets a
// bearer token of its own. Stop stops what it started, also when Start
// fails.
func Start(dir, bin string, users ...string) (*ControlPlane, error) {
	if err := Check(bin, "etcd", "kube-apiserver"); err != nil {
		return nil, err
	}
	cp := &ControlPlane{dir: dir, bin: bin, Token: ids.Secret(), Kubeconfig: filepath.Join(dir, "kubeconfig"), tokens: map[string]string{}}
	ports, err := freePorts(3)
	if err != nil {
		return cp, err
	}
	etcdPort, peerPort, apiPort := ports[0], ports[1], ports[2]
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	if _, err := cp.run("etcd", exec.Command(filepath.Join(bin, "etcd"),
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL,
		"--unsafe-no-fsync", "--quota-backend-bytes", strconv.Itoa(1<<30))); err != nil {
		return cp, err
	}

	saKey := filepath.Join(dir, "sa.key")
	if err := writeRSAKey(saKey); err != nil {
		return cp, err
	}
	tokens := filepath.Join(dir, "tokens.csv")
	lines := cp.Token + `,admin,admin,"system:masters"` + "\n"
	for i, u := range users {
		cp.tokens[u] = ids.Secret()
		lines += fmt.Sprintf("%s,%s,user%d\n", cp.tokens[u], u, i)
	}
	if err := os.WriteFile(tokens, []byte(lines), 0o600); err != nil {
		return cp, err
	}
	api, err := cp.run("kube-apiserver", exec.Command(filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(apiPort), "--cert-dir", filepath.Join(dir, "certs"),
		"--token-auth-file", tokens, "--authorization-mode", "RBAC",
		"--service-cluster-ip-range", "10.0.0.0/24",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", saKey, "--service-account-signing-key-file", saKey,
		// A loopback address cannot be advertised as the kubernetes
		// Service's endpoint; nothing here needs that endpoint.
		"--endpoint-reconciler-type", "none",
		"--allow-privileged"))
	if err != nil {
		return cp, err
	}
	cp.URL = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	if err := cp.writeKubeconfig(cp.Kubeconfig, cp.Token); err != nil {
		return cp, err
	}
	return cp, cp.waitReady(api, 2*time.Minute)
}

// RestConfig is a client-go configuration for the control plane as its
// administrator.
func (cp *ControlPlane) RestConfig() *rest.Config {
	return &rest.Config{Host: cp.URL, BearerToken: cp.Token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true}, // its own self-signed certificate
		QPS:             100, Burst: 200}
}

// ConfigAs is RestConfig for one of the users given to Start.
func (cp *ControlPlane) ConfigAs(user string) (*rest.Config, error) {
	tok, ok := cp.tokens[user]
	if !ok {
		return nil, fmt.Errorf("localkube: %q was not given to Start", user)
	}
	cfg := cp.RestConfig()
	cfg.BearerToken = tok
	return cfg, nil
}

// KubeconfigAs writes a kubeconfig for one of the users given to Start,
// for a process run as that user, and returns its path.
func (cp *ControlPlane) KubeconfigAs(user string) (string, error) {
	tok, ok := cp.tokens[user]
	if !ok {
		return "", fmt.Errorf("localkube: %q was not given to Start", user)
	}
	f, err := os.CreateTemp(cp.dir, "kubeconfig-*")
	if err != nil {
		return "", err
	}
	f.Close()
	return f.Name(), cp.writeKubeconfig(f.Name(), tok)
}

// StartScheduler runs kube-scheduler against the control plane until
// Stop.
func (cp *ControlPlane) StartScheduler() error {
	if err := Check(cp.bin, "kube-scheduler"); err != nil {
		return err
	}
	_, err := cp.run("kube-scheduler", exec.Command(filepath.Join(cp.bin, "kube-scheduler"),
		"--kubeconfig", cp.Kubeconfig, "--leader-elect=false", "--secure-port=0"))
	return err
}

// Log returns the end of a component's log ("kube-apiserver",
// "kube-scheduler", "etcd"), for a failure message.
func (cp *ControlPlane) Log(name string) string {
	b, _ := os.ReadFile(filepath.Join(cp.dir, name+".log"))
	return string(tail(b, 3000))
}

// Kubectl runs kubectl against the control plane with stdin and returns
// its combined output and error.
func (cp *ControlPlane) Kubectl(stdin string, args ...string) (string, error) {
	cmd := exec.Command("kubectl", append([]string{"--kubeconfig", cp.Kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cp.Kubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil {
		err = fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), err
}

// Stop stops the components, the last started first: an interrupt, then
// a kill after 10 s.
func (cp *ControlPlane) Stop() {
	cp.mu.Lock()
	procs := cp.procs
	cp.procs = nil
	cp.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		p := procs[i]
		p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-p.exited
		}
	}
}

func (cp *ControlPlane) writeKubeconfig(path, token string) error {
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: %s
    insecure-skip-tls-verify: true
users:
- name: user
  user:
    token: %s
contexts:
- name: local
  context: {cluster: local, user: user, namespace: default}
current-context: local
`, cp.URL, token)
	return os.WriteFile(path, []byte(cfg), 0o600)
}

// waitReady waits for the apiserver's /readyz, or for it to exit.
func (cp *ControlPlane) waitReady(exited <-chan struct{}, limit time.Duration) error {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // its own self-signed certificate
	deadline := time.Now().Add(limit)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("kube-apiserver exited:\n%s", cp.Log("kube-apiserver"))
		default:
		}
		req, _ := http.NewRequestWithContext(context.Background(), "GET", cp.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+cp.Token)
		resp, err := hc.Do(req)
		if err == nil {
			var b bytes.Buffer
			b.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b.String())
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver not ready in %s: %s\n%s", limit, last, cp.Log("kube-apiserver"))
}

// run starts cmd with its output in dir/name.log, until Stop; it dies
// with this process too. The channel closes when it exits.
func (cp *ControlPlane) run(name string, cmd *exec.Cmd) (<-chan struct{}, error) {
	logf, err := os.Create(filepath.Join(cp.dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, exited: make(chan struct{})}
	go func() { cmd.Wait(); logf.Close(); close(p.exited) }()
	cp.mu.Lock()
	cp.procs = append(cp.procs, p)
	cp.mu.Unlock()
	return p.exited, nil
}

// freePorts returns n distinct loopback ports nobody listens on.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close() // held until all are picked, so none repeats
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func writeRSAKey(path string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	b := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	return os.WriteFile(path, b, 0o600)
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
