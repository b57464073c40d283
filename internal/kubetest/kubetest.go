// Package kubetest runs a Kubernetes control plane for tests: etcd,
// kube-apiserver and, when asked, kube-scheduler, built by
// tools/kube/build.sh (found through $AIRLOCK_KUBE_BIN), on loopback
// ports, with their files in a temporary directory, one bearer token in
// group system:masters and one per named user, and kubectl (from the
// host) pointed at it through a kubeconfig of its own.
package kubetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/testenv"
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
	tokens     map[string]string // the users' tokens, by user
}

// Start starts a control plane that is stopped when the test ends. Each
// of users ("system:serviceaccount:NS:NAME" for a service account) gets a
// bearer token of its own, for ConfigAs. A host without the binaries
// (AIRLOCK_KUBE_BIN unset or wrong) or kubectl is Lacking.
func Start(t *testing.T, users ...string) *ControlPlane {
	t.Helper()
	bin := os.Getenv("AIRLOCK_KUBE_BIN")
	for _, name := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(bin, name)); bin == "" || err != nil {
			testenv.Lacking(t, "no %s in $AIRLOCK_KUBE_BIN (%q): tools/kube/build.sh builds it (make unit does)", name, bin)
		}
	}
	if _, err := exec.LookPath("kubectl"); err != nil {
		testenv.Lacking(t, "no kubectl on PATH")
	}
	dir := t.TempDir()
	cp := &ControlPlane{dir: dir, Token: ids.Secret(), Kubeconfig: filepath.Join(dir, "kubeconfig"), tokens: map[string]string{}}

	etcdPort, peerPort, apiPort := freePort(t), freePort(t), freePort(t)
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	run(t, dir, "etcd", exec.Command(filepath.Join(bin, "etcd"),
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", "http://127.0.0.1:"+strconv.Itoa(peerPort),
		"--initial-advertise-peer-urls", "http://127.0.0.1:"+strconv.Itoa(peerPort),
		"--initial-cluster", "default=http://127.0.0.1:"+strconv.Itoa(peerPort),
		"--unsafe-no-fsync", "--quota-backend-bytes", strconv.Itoa(1<<30)))

	saKey := filepath.Join(dir, "sa.key")
	writeRSAKey(t, saKey)
	tokens := filepath.Join(dir, "tokens.csv")
	lines := cp.Token + `,admin,admin,"system:masters"` + "\n"
	for i, u := range users {
		cp.tokens[u] = ids.Secret()
		lines += fmt.Sprintf("%s,%s,user%d\n", cp.tokens[u], u, i)
	}
	if err := os.WriteFile(tokens, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	api := run(t, dir, "kube-apiserver", exec.Command(filepath.Join(bin, "kube-apiserver"),
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
	cp.URL = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	cp.writeKubeconfig(t)
	cp.waitReady(t, api, 2*time.Minute)
	return cp
}

// RestConfig is a client-go configuration for the control plane as its
// administrator.
func (cp *ControlPlane) RestConfig() *rest.Config {
	return &rest.Config{Host: cp.URL, BearerToken: cp.Token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true}, // its own self-signed certificate
		QPS:             100, Burst: 200}
}

// ConfigAs is RestConfig for one of the users given to Start.
func (cp *ControlPlane) ConfigAs(t *testing.T, user string) *rest.Config {
	t.Helper()
	tok, ok := cp.tokens[user]
	if !ok {
		t.Fatalf("kubetest: %q was not given to Start", user)
	}
	cfg := cp.RestConfig()
	cfg.BearerToken = tok
	return cfg
}

// StartScheduler runs kube-scheduler against the control plane until the
// test ends.
func (cp *ControlPlane) StartScheduler(t *testing.T) {
	t.Helper()
	bin := os.Getenv("AIRLOCK_KUBE_BIN")
	if _, err := os.Stat(filepath.Join(bin, "kube-scheduler")); bin == "" || err != nil {
		testenv.Lacking(t, "no kube-scheduler in $AIRLOCK_KUBE_BIN (%q): tools/kube/build.sh builds it (make unit does)", bin)
	}
	run(t, cp.dir, "kube-scheduler", exec.Command(filepath.Join(bin, "kube-scheduler"),
		"--kubeconfig", cp.Kubeconfig, "--leader-elect=false", "--secure-port=0"))
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
	return string(out), err
}

// MustKubectl is Kubectl that fails the test on an error.
func (cp *ControlPlane) MustKubectl(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	out, err := cp.Kubectl(stdin, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// KubeconfigAs writes a kubeconfig for one of the users given to Start,
// for a process the test runs as that user, and returns its path.
func (cp *ControlPlane) KubeconfigAs(t *testing.T, user string) string {
	t.Helper()
	tok, ok := cp.tokens[user]
	if !ok {
		t.Fatalf("kubetest: %q was not given to Start", user)
	}
	f, err := os.CreateTemp(cp.dir, "kubeconfig-*")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	cp.writeKubeconfigFor(t, f.Name(), tok)
	return f.Name()
}

func (cp *ControlPlane) writeKubeconfig(t *testing.T) {
	t.Helper()
	cp.writeKubeconfigFor(t, cp.Kubeconfig, cp.Token)
}

func (cp *ControlPlane) writeKubeconfigFor(t *testing.T, path, token string) {
	t.Helper()
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: %s
contexts:
- name: test
  context: {cluster: test, user: admin, namespace: default}
current-context: test
`, cp.URL, token)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
}

// waitReady waits for the apiserver's /readyz, or for it to exit.
func (cp *ControlPlane) waitReady(t *testing.T, exited <-chan struct{}, limit time.Duration) {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // its own self-signed certificate
	deadline := time.Now().Add(limit)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(cp.dir, "kube-apiserver.log"))
			t.Fatalf("kube-apiserver exited:\n%s", tail(log, 3000))
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
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b.String())
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	log, _ := os.ReadFile(filepath.Join(cp.dir, "kube-apiserver.log"))
	t.Fatalf("kube-apiserver not ready in %s: %s\n%s", limit, last, tail(log, 3000))
}

// run starts cmd with its output in dir/name.log and stops it when the
// test ends. The channel closes when it exits.
func run(t *testing.T, dir, name string, cmd *exec.Cmd) <-chan struct{} {
	t.Helper()
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	return exited
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func writeRSAKey(t *testing.T, path string) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	b := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
