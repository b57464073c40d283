// Package localcluster runs a whole airlock cluster on one machine, for
// trying cluster mode and for the bench: etcd, kube-apiserver and
// kube-scheduler (internal/localkube), a throwaway PostgreSQL
// (internal/localpg), airlock's namespace, RuntimeClass and RBAC from
// deploy/, node agents (`airlock node`) on data directories of their own
// and API replicas (`airlock serve --cluster kubernetes`), each as the
// service account its manifests name. Everything lives under one
// directory and goes with Stop. Nothing in it is durable: it is not how a
// real cluster is run (docs/kubernetes.md is).
package localcluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/airlockhq/airlock/deploy"
	"github.com/airlockhq/airlock/internal/clustertls"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/localkube"
	"github.com/airlockhq/airlock/internal/localpg"
	"github.com/airlockhq/airlock/internal/secrets"
	"github.com/airlockhq/airlock/internal/template"
)

// The namespace and the service accounts of deploy/.
const (
	Namespace  = "airlock"
	nodeUser   = "system:serviceaccount:airlock:airlock-node"
	serverUser = "system:serviceaccount:airlock:airlock-server"
)

// Config says what cluster to run.
type Config struct {
	// Dir holds every file of the cluster; it must be empty or absent.
	Dir string
	// KubeBin is the directory of etcd, kube-apiserver and kube-scheduler
	// (tools/kube/build.sh prints it).
	KubeBin string
	// Airlock is the airlock binary the nodes and replicas run.
	Airlock string
	// Source is a set-up data directory (`airlock setup`): its boot
	// artifacts and templates are every node's and replica's.
	Source datadir.Dir
	// Nodes and Replicas are how many node agents and API replicas run.
	Nodes, Replicas int
	// NodeCPUs is the vCPUs each node offers sandboxes: kube-scheduler
	// places no more sandboxes on a node than their vCPUs (and the
	// RuntimeClass's overhead) fit. Default: four times this host's CPUs,
	// since sandboxes mostly idle; the nodes share them.
	NodeCPUs int
	// NodeArgs are more flags for every node (--max-sandboxes).
	NodeArgs []string
	// Log gets a line per step; nil discards them.
	Log io.Writer
}

// Cluster is a running local cluster.
type Cluster struct {
	// Replicas are the API replicas' URLs; any of them serves the API.
	Replicas []string
	// Nodes are the node agents' names.
	Nodes []string
	// Key is the admin API key the first replica made.
	Key string
	// Kubeconfig is an administrator's kubeconfig for the control plane.
	Kubeconfig string

	cfg    Config
	cp     *localkube.ControlPlane
	pg     *localpg.Cluster
	mu     sync.Mutex
	procs  []*proc
	exited chan string
}

// proc is a node agent or a replica.
type proc struct {
	name string
	home string
	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs the cluster and returns once every replica serves and every
// node is registered. On an error it stops what it started.
func Start(ctx context.Context, cfg Config) (c *Cluster, err error) {
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if cfg.NodeCPUs == 0 {
		cfg.NodeCPUs = 4 * runtime.NumCPU()
	}
	if cfg.Nodes < 1 || cfg.Replicas < 1 {
		return nil, fmt.Errorf("a local cluster needs at least one node and one replica: %w", errdefs.ErrInvalid)
	}
	if _, err := os.Stat(cfg.Source.Kernel()); err != nil {
		return nil, fmt.Errorf("%s is not set up (no kernel): run `airlock setup` (make setup) first: %w", cfg.Source.Root, errdefs.ErrPrecondition)
	}
	if err := localkube.Check(cfg.KubeBin, "etcd", "kube-apiserver", "kube-scheduler"); err != nil {
		return nil, err
	}
	if entries, err := os.ReadDir(cfg.Dir); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("%s is not empty: a local cluster runs there or one was not stopped (Remove clears it): %w", cfg.Dir, errdefs.ErrConflict)
	}
	// The postgres user traverses it to its own directory.
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	c = &Cluster{cfg: cfg, exited: make(chan string, cfg.Nodes+cfg.Replicas)}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()

	fmt.Fprintln(cfg.Log, "starting etcd, kube-apiserver and kube-scheduler")
	kubeDir := filepath.Join(cfg.Dir, "kube")
	if err := os.Mkdir(kubeDir, 0o700); err != nil {
		return c, err
	}
	c.cp, err = localkube.Start(kubeDir, cfg.KubeBin, nodeUser, serverUser)
	if err != nil {
		return c, err
	}
	c.Kubeconfig = c.cp.Kubeconfig
	if err := c.cp.StartScheduler(); err != nil {
		return c, err
	}
	if err := deploy.ApplyBase(c.cp.Kubectl); err != nil {
		return c, err
	}
	// No kube-controller-manager here makes the namespace's default
	// service account, which Pod admission looks up.
	if _, err := c.cp.Kubectl("", "-n", Namespace, "create", "serviceaccount", "default"); err != nil {
		return c, err
	}

	fmt.Fprintln(cfg.Log, "starting PostgreSQL")
	c.pg, err = localpg.Start()
	if err != nil {
		return c, err
	}
	if err := os.WriteFile(filepath.Join(cfg.Dir, "postgres.dir"), []byte(c.pg.Dir()+"\n"), 0o600); err != nil {
		return c, err
	}
	db, err := c.pg.CreateDatabase()
	if err != nil {
		return c, err
	}
	storeURL := c.pg.URL(db)

	// One internal token, one secrets key and one E2B token key for all:
	// a secret stored through one replica is read by every node.
	token := ids.Secret() + ids.Secret()
	tokenFile := filepath.Join(cfg.Dir, "cluster.token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		return c, err
	}
	keys := map[string][]byte{}
	for name, size := range map[string]int{"secrets.key": secrets.KeySize, "e2b-token.key": 32} {
		if keys[name], err = secrets.LoadOrCreateKey(filepath.Join(cfg.Dir, "keys", name), size); err != nil {
			return c, err
		}
	}
	// One cluster CA: the replicas and the nodes call one another over
	// TLS with its certificates.
	tlsDir := filepath.Join(cfg.Dir, "tls")
	if err := clustertls.Generate(tlsDir, 30*24*time.Hour); err != nil {
		return c, err
	}
	common := []string{"--store", storeURL, "--namespace", Namespace, "--token-file", tokenFile}
	nodeKube, err := c.cp.KubeconfigAs(nodeUser)
	if err != nil {
		return c, err
	}
	serverKube, err := c.cp.KubeconfigAs(serverUser)
	if err != nil {
		return c, err
	}

	// The first replica makes the store's tables, its templates and the
	// admin key before any other starts. The nodes fetch template images
	// they lack from the replicas' internal listeners.
	var sources []string
	for i := 1; i <= cfg.Replicas; i++ {
		name := fmt.Sprintf("replica-%d", i)
		fmt.Fprintf(cfg.Log, "starting %s\n", name)
		addr, err := freeAddr()
		if err != nil {
			return c, err
		}
		internal, err := freeAddr()
		if err != nil {
			return c, err
		}
		args := append([]string{"serve", "--listen", addr, "--cluster", "kubernetes", "--kubeconfig", serverKube,
			"--cluster-tls", filepath.Join(tlsDir, "server"), "--internal-listen", internal}, common...)
		if _, err := c.launch(ctx, name, keys, "airlock serving on", args); err != nil {
			return c, err
		}
		c.Replicas = append(c.Replicas, "http://"+addr)
		sources = append(sources, "https://"+internal)
		if i == 1 {
			b, err := os.ReadFile(filepath.Join(cfg.Dir, name, "admin.key"))
			if err != nil {
				return c, fmt.Errorf("the first replica's admin key: %w", err)
			}
			c.Key = strings.TrimSpace(string(b))
		}
	}
	for i := 1; i <= cfg.Nodes; i++ {
		name := fmt.Sprintf("node-%d", i)
		fmt.Fprintf(cfg.Log, "starting %s\n", name)
		addr, err := freeAddr()
		if err != nil {
			return c, err
		}
		args := append(append([]string{"node", "--name", name, "--listen", addr, "--kubeconfig", nodeKube,
			"--cpus", strconv.Itoa(cfg.NodeCPUs), "--cluster-tls", filepath.Join(tlsDir, "node"),
			"--templates-from", strings.Join(sources, ",")}, common...), cfg.NodeArgs...)
		if _, err := c.launch(ctx, name, keys, "airlock node "+name+" serving", args); err != nil {
			return c, err
		}
		c.Nodes = append(c.Nodes, name)
	}
	return c, c.waitNodes(ctx, time.Minute)
}

// Exited yields the name of a node or replica that stopped by itself.
func (c *Cluster) Exited() <-chan string { return c.exited }

// Log returns the end of a node's or replica's output.
func (c *Cluster) Log(name string) string {
	b, _ := os.ReadFile(filepath.Join(c.cfg.Dir, name+".log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Cordon marks a node unschedulable, or schedulable again: kube-scheduler
// then binds no new sandbox Pod to it, and those it runs stay.
func (c *Cluster) Cordon(name string, on bool) error {
	verb := "uncordon"
	if on {
		verb = "cordon"
	}
	_, err := c.cp.Kubectl("", verb, name)
	return err
}

// Stop stops the replicas, then the nodes, kills the VMs they left
// running, and stops PostgreSQL and the control plane; Remove then clears
// Dir.
func (c *Cluster) Stop() {
	c.mu.Lock()
	procs := c.procs
	c.procs = nil
	c.mu.Unlock()
	for _, p := range procs {
		p.stop()
	}
	for _, p := range procs {
		reapVMs(p.home)
	}
	if c.pg != nil {
		c.pg.Stop()
	}
	if c.cp != nil {
		c.cp.Stop()
	}
}

// Remove clears dir of a stopped local cluster, also of one whose
// supervisor was killed (its nodes' VMs and its PostgreSQL's files
// included).
func Remove(dir string) error {
	homes, _ := filepath.Glob(filepath.Join(dir, "*", "sandboxes"))
	for _, h := range homes {
		reapVMs(filepath.Dir(h))
	}
	if b, err := os.ReadFile(filepath.Join(dir, "postgres.dir")); err == nil {
		if pg := strings.TrimSpace(string(b)); strings.HasPrefix(pg, "/tmp/airlock-pg-") {
			os.RemoveAll(pg)
		}
	}
	return os.RemoveAll(dir)
}

// launch starts an airlock command named name on a data directory of its
// own under Dir (the source's boot artifacts and templates, and the
// cluster's keys) and waits for a line of its output that starts with ready.
// A node's template store is its own, holding links to the source's
// templates: what it builds or fetches, and reclaims, is then its own,
// never the source's.
func (c *Cluster) launch(ctx context.Context, name string, keys map[string][]byte, ready string, args []string) (*proc, error) {
	home := filepath.Join(c.cfg.Dir, name)
	if err := os.Mkdir(home, 0o700); err != nil {
		return nil, err
	}
	links := []string{"boot", "templates", "accel.json"}
	if len(args) > 0 && args[0] == "node" {
		links = []string{"boot", "accel.json"}
		if err := linkTemplates(c.cfg.Source, datadir.Dir{Root: home}); err != nil {
			return nil, err
		}
	}
	for _, link := range links {
		if err := os.Symlink(filepath.Join(c.cfg.Source.Root, link), filepath.Join(home, link)); err != nil {
			return nil, err
		}
	}
	for file, key := range keys {
		if err := os.WriteFile(filepath.Join(home, file), key, 0o600); err != nil {
			return nil, err
		}
	}
	logf, err := os.Create(filepath.Join(c.cfg.Dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(c.cfg.Airlock, args...)
	cmd.Env = append(os.Environ(), "AIRLOCK_HOME="+home)
	cmd.Stderr = logf
	// It stops with this process; its VMs are reaped by Stop or Remove.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	out, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, home: home, cmd: cmd, done: make(chan struct{})}
	serving := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		seen := false
		for sc.Scan() {
			fmt.Fprintln(logf, sc.Text())
			if !seen && strings.HasPrefix(sc.Text(), ready) {
				seen = true
				close(serving)
			}
		}
	}()
	go func() {
		cmd.Wait()
		logf.Close()
		close(p.done)
		c.mu.Lock()
		live := false
		for _, q := range c.procs {
			live = live || q == p
		}
		c.mu.Unlock()
		if live {
			c.exited <- name
		}
	}()
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	select {
	case <-serving:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("%s exited at start:\n%s", name, c.Log(name))
	case <-time.After(2 * time.Minute):
		return nil, fmt.Errorf("%s not serving in 2 minutes:\n%s", name, c.Log(name))
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// stop ends the process: SIGTERM, then SIGKILL after 30 s.
func (p *proc) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// waitNodes waits until every node's Node is registered without the
// not-ready taint virtual-kubelet starts it with.
func (c *Cluster) waitNodes(ctx context.Context, limit time.Duration) error {
	kc, err := kubernetes.NewForConfig(c.cp.RestConfig())
	if err != nil {
		return err
	}
	deadline := time.Now().Add(limit)
	for _, name := range c.Nodes {
		for {
			n, err := kc.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err == nil && ready(n) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("node %s not ready in %s (%v):\n%s", name, limit, err, c.Log(name))
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

// ready says whether a Node has no taint but the one that keeps all but
// sandbox Pods off it.
func ready(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key != "virtual-kubelet.io/provider" {
			return false
		}
	}
	return !n.Spec.Unschedulable
}

// reapVMs kills the QEMUs a node agent's sandboxes left running (they
// outlive the agent by design).
func reapVMs(home string) {
	pids, _ := filepath.Glob(filepath.Join(home, "sandboxes", "*", "qemu.pid"))
	for _, f := range pids {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// freeAddr returns a loopback address with a port nobody listens on.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// linkTemplates gives dst a template store of its own that holds every
// template of src's, by link (template.Store.Link).
func linkTemplates(src, dst datadir.Dir) error {
	from, to := template.Open(src), template.Open(dst)
	ts, err := from.List()
	if err != nil {
		return err
	}
	for _, t := range ts {
		if _, err := to.Link(from, t.Ref()); err != nil {
			return err
		}
	}
	return nil
}
