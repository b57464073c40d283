package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/localcluster"
)

const localClusterAbout = `Runs a whole airlock cluster on this machine until SIGINT or SIGTERM (or
` + "`airlock localcluster down`" + `), for trying cluster mode (docs/kubernetes.md):
etcd, kube-apiserver and kube-scheduler (from --kube-bin, which
tools/kube/build.sh builds), a throwaway PostgreSQL, airlock's namespace,
RuntimeClass and RBAC, --nodes node agents on data directories of their
own and --replicas API replicas, all on loopback ports and under --dir.
Each node offers --node-cpus vCPUs (four times this host's CPUs by
default: sandboxes mostly idle, and the nodes share the host); a create
beyond what the nodes fit waits, its Pod Pending, until one is deleted.

Once it is up it prints, and writes to DIR/env, what a client needs:

  AIRLOCK_URL=http://127.0.0.1:PORT     (the first replica; any serves)
  AIRLOCK_API_KEY=...                   (an admin key)
  KUBECONFIG=DIR/kube/kubeconfig        (the control plane's administrator)

The nodes and replicas share this host's set-up boot artifacts and
templates ($AIRLOCK_HOME, from ` + "`airlock setup`" + `). Nothing in it is durable:
stopping it removes its VMs, its database and DIR.

  airlock localcluster                  (make cluster)
  airlock localcluster down             (make cluster-down)`

func runLocalCluster(ctx context.Context, env *Env, args []string) error {
	if len(args) > 0 && args[0] == "down" {
		return runLocalClusterDown(env, args[1:])
	}
	fs := newFlagSet("localcluster", "airlock localcluster [down] [FLAGS]", localClusterAbout, env)
	dir := fs.String("dir", defaultClusterDir(env), "`directory` of the cluster's files")
	kubeBin := fs.String("kube-bin", os.Getenv("AIRLOCK_KUBE_BIN"), "`directory` of etcd, kube-apiserver and kube-scheduler (default: $AIRLOCK_KUBE_BIN)")
	nodes := fs.Int("nodes", 2, "how many node agents")
	replicas := fs.Int("replicas", 2, "how many API replicas")
	nodeCPUs := fs.Int("node-cpus", 4*runtime.NumCPU(), "vCPUs each node offers sandboxes (kube-scheduler places no more than fit)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("localcluster: unexpected argument %q: %w", fs.Arg(0), errdefs.ErrInvalid)
	}
	if *nodes < 1 || *nodes > 8 || *replicas < 1 || *replicas > 8 {
		return fmt.Errorf("localcluster: --nodes and --replicas must be between 1 and 8: %w", errdefs.ErrInvalid)
	}
	if *nodeCPUs < 1 {
		return fmt.Errorf("localcluster: --node-cpus must be at least 1: %w", errdefs.ErrInvalid)
	}
	if *kubeBin == "" {
		return fmt.Errorf("localcluster: --kube-bin (or $AIRLOCK_KUBE_BIN) is needed: tools/kube/build.sh builds the binaries and prints their directory: %w", errdefs.ErrInvalid)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	if pid := clusterPID(*dir); pid > 0 {
		return fmt.Errorf("localcluster: a local cluster runs in %s already (pid %d): `airlock localcluster down` stops it: %w", *dir, pid, errdefs.ErrConflict)
	}
	if _, err := os.Stat(*dir); err == nil {
		env.Log.Info("clearing the files of a local cluster that was not stopped", "dir", *dir)
		if err := removeLocalCluster(*dir); err != nil {
			return fmt.Errorf("localcluster: %w", err)
		}
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	pidFile := filepath.Join(*dir, "localcluster.pid")
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-sigs:
			cancel()
		case <-sctx.Done():
		}
	}()
	// The cluster's files go in a directory under dir, so that the pid
	// file stays until everything is stopped.
	c, err := localcluster.Start(sctx, localcluster.Config{Dir: filepath.Join(*dir, "cluster"), KubeBin: *kubeBin,
		Airlock: self, Source: env.Dir, Nodes: *nodes, Replicas: *replicas, NodeCPUs: *nodeCPUs, Log: env.Stderr})
	if err != nil {
		removeLocalCluster(*dir)
		return fmt.Errorf("localcluster: %w", err)
	}
	lines := fmt.Sprintf("AIRLOCK_URL=%s\nAIRLOCK_API_KEY=%s\nKUBECONFIG=%s\n", c.Replicas[0], c.Key, c.Kubeconfig)
	if err := os.WriteFile(filepath.Join(*dir, "env"), []byte(lines), 0o600); err != nil {
		c.Stop()
		removeLocalCluster(*dir)
		return fmt.Errorf("localcluster: %w", err)
	}
	fmt.Fprint(env.Stdout, lines)
	fmt.Fprintf(env.Stderr, "local cluster up: replicas %s; nodes %s; logs in %s\nCtrl-C or `airlock localcluster down` stops it\n",
		strings.Join(c.Replicas, " "), strings.Join(c.Nodes, " "), filepath.Join(*dir, "cluster"))
	for done := false; !done; {
		select {
		case name := <-c.Exited():
			env.Log.Error("a part of the local cluster exited; the rest runs on", "name", name, "output", c.Log(name))
		case <-sctx.Done():
			done = true
		}
	}
	fmt.Fprintln(env.Stderr, "stopping the local cluster")
	c.Stop()
	if err := removeLocalCluster(*dir); err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	fmt.Fprintln(env.Stderr, "local cluster stopped and its files removed")
	return nil
}

func runLocalClusterDown(env *Env, args []string) error {
	fs := newFlagSet("localcluster down", "airlock localcluster down [--dir DIR]",
		"Stops the local cluster in --dir and removes its files, also those of one that was killed.", env)
	dir := fs.String("dir", defaultClusterDir(env), "`directory` of the cluster's files")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("localcluster down: unexpected argument %q: %w", fs.Arg(0), errdefs.ErrInvalid)
	}
	if pid := clusterPID(*dir); pid > 0 {
		syscall.Kill(pid, syscall.SIGTERM)
		deadline := time.Now().Add(2 * time.Minute)
		for clusterPID(*dir) == pid && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		if clusterPID(*dir) == pid {
			env.Log.Warn("the local cluster did not stop in 2 minutes; killing it", "pid", pid)
			syscall.Kill(pid, syscall.SIGKILL)
			time.Sleep(time.Second)
		}
	} else if _, err := os.Stat(*dir); errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(env.Stderr, "no local cluster in %s\n", *dir)
		return nil
	}
	if err := removeLocalCluster(*dir); err != nil {
		return fmt.Errorf("localcluster down: %w", err)
	}
	fmt.Fprintf(env.Stderr, "local cluster in %s stopped and removed\n", *dir)
	return nil
}

// removeLocalCluster removes dir: the cluster's files (its VMs and its
// database too), then the pid and env files.
func removeLocalCluster(dir string) error {
	if err := localcluster.Remove(filepath.Join(dir, "cluster")); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// defaultClusterDir is beside the data directory.
func defaultClusterDir(env *Env) string {
	return strings.TrimSuffix(env.Dir.Root, "/") + "-cluster"
}

// clusterPID is the pid of the live `airlock localcluster` of dir, or 0.
func clusterPID(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "localcluster.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid < 1 {
		return 0
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(string(cmdline), "localcluster") {
		return 0
	}
	return pid
}
