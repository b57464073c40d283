package e2e

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/localkube"
	"github.com/airlockhq/airlock/internal/testenv"
)

// TestLocalCluster: `airlock localcluster` (make cluster) starts a whole
// cluster on this machine and prints what a client needs; a second one on
// the same directory is refused while it runs; the CLI and
// examples/python/first_sandbox.py work against it unchanged, through
// either replica, on VMs the node agents make; `airlock localcluster down`
// (make cluster-down) stops it all, the VMs of the sandboxes still running
// included, and removes its files.
func TestLocalCluster(t *testing.T) {
	kubeBin := os.Getenv("AIRLOCK_KUBE_BIN")
	if err := localkube.Check(kubeBin, "etcd", "kube-apiserver", "kube-scheduler"); err != nil {
		testenv.Lacking(t, "%v (make e2e builds them)", err)
	}
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is needed for the example (airlock setup installs it)")
	}
	dir := filepath.Join(t.TempDir(), "cluster")
	env := append(os.Environ(), "AIRLOCK_HOME="+dataDir().Root)
	up := exec.Command(binPath(), "localcluster", "--dir", dir, "--kube-bin", kubeBin)
	up.Env = env
	var stderr safeBuffer
	up.Stderr = &stderr
	out, err := up.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- up.Wait()
	}()
	down := func() (string, int) {
		cmd := exec.Command(binPath(), "localcluster", "down", "--dir", dir)
		cmd.Env = env
		b, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		return string(b), code
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("airlock localcluster's output:\n%s", stderr.String())
		}
		down()
	})

	vars := map[string]string{}
	timeout := time.After(4 * time.Minute)
	for vars["KUBECONFIG"] == "" {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("airlock localcluster exited (%v):\n%s", <-exited, stderr.String())
			}
			if k, v, ok := strings.Cut(line, "="); ok {
				vars[k] = v
			}
		case <-timeout:
			t.Fatalf("airlock localcluster printed no KUBECONFIG= in 4 minutes:\n%s", stderr.String())
		}
	}
	if !strings.HasPrefix(vars["AIRLOCK_URL"], "http://127.0.0.1:") || !strings.HasPrefix(vars["AIRLOCK_API_KEY"], "alk_") {
		t.Fatalf("printed %v", vars)
	}
	saved, err := os.ReadFile(filepath.Join(dir, "env"))
	if err != nil || !strings.Contains(string(saved), "AIRLOCK_API_KEY="+vars["AIRLOCK_API_KEY"]+"\n") {
		t.Errorf("the env file: %v %q", err, saved)
	}
	// The other replica, from the progress line, which comes on stderr
	// after the variables on stdout.
	var replicas []string
	testenv.Eventually(t, 10*time.Second, "the progress line naming the replicas", func() (bool, string) {
		for _, line := range strings.Split(stderr.String(), "\n") {
			if rest, ok := strings.CutPrefix(line, "local cluster up: replicas "); ok {
				replicas = strings.Fields(strings.Split(rest, ";")[0])
				return true, ""
			}
		}
		return false, stderr.String()
	})
	if len(replicas) != 2 || replicas[0] != vars["AIRLOCK_URL"] {
		t.Fatalf("replicas %v, want two, the first %s", replicas, vars["AIRLOCK_URL"])
	}

	second := exec.Command(binPath(), "localcluster", "--dir", dir, "--kube-bin", kubeBin)
	second.Env = env
	if b, err := second.CombinedOutput(); err == nil || second.ProcessState.ExitCode() != 2 || !strings.Contains(string(b), "runs in "+dir+" already") {
		t.Errorf("a second local cluster on the directory: %v\n%s", err, b)
	}

	kubectl := func(args ...string) string {
		cmd := exec.Command("kubectl", args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+vars["KUBECONFIG"])
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, b)
		}
		return string(b)
	}
	if nodes := kubectl("get", "nodes", "-o", "name"); nodes != "node/node-1\nnode/node-2\n" {
		t.Errorf("nodes %q", nodes)
	}

	// The CLI through the first replica; the sandbox stays for the down.
	first := &server{url: vars["AIRLOCK_URL"], key: vars["AIRLOCK_API_KEY"]}
	r := serverCLI(t, first, "", "sandbox", "create", "--template", "tiny")
	if r.code != 0 {
		t.Fatalf("sandbox create: %d %s", r.code, r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	if r = serverCLI(t, first, "", "exec", id, "--", "sh", "-c", "echo from $(hostname)"); r.code != 0 || !strings.HasPrefix(r.stdout, "from ") {
		t.Errorf("exec: %d %q %s", r.code, r.stdout, r.stderr)
	}
	// The node reports the Pod's status on its own schedule.
	testenv.Eventually(t, 30*time.Second, "the sandbox's Pod running on a node", func() (bool, string) {
		pods := kubectl("-n", "airlock", "get", "pods", "-o", "custom-columns=NODE:.spec.nodeName,PHASE:.status.phase", "--no-headers")
		return strings.HasPrefix(pods, "node-") && strings.Contains(pods, "Running"), pods
	})
	qemus, _ := filepath.Glob(filepath.Join(dir, "cluster", "node-*", "sandboxes", id, "qemu.pid"))
	if len(qemus) != 1 {
		t.Fatalf("qemu.pid of %s on the nodes: %v", id, qemus)
	}
	b, _ := os.ReadFile(qemus[0])
	qemu, _ := strconv.Atoi(strings.TrimSpace(string(b)))

	// The example through the second replica.
	ex := exec.Command(python, "../examples/python/first_sandbox.py")
	ex.Env = append(os.Environ(), "AIRLOCK_URL="+replicas[1], "AIRLOCK_API_KEY="+vars["AIRLOCK_API_KEY"], "AIRLOCK_TEMPLATE=tiny")
	if b, err := ex.CombinedOutput(); err != nil {
		t.Errorf("the example through the second replica: %v\n%s", err, b)
	}

	if msg, code := down(); code != 0 || !strings.Contains(msg, "stopped and removed") {
		t.Errorf("localcluster down: %d %s", code, msg)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("airlock localcluster exited with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("airlock localcluster still runs after down")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the cluster's directory is still there: %v", err)
	}
	if qemu < 2 {
		t.Fatalf("qemu pid %d", qemu)
	}
	testenv.Eventually(t, 10*time.Second, "the sandbox's QEMU gone", func() (bool, string) {
		err := syscall.Kill(qemu, 0)
		return err == syscall.ESRCH, "kill 0: " + errString(err)
	})
	if msg, code := down(); code != 0 || !strings.Contains(msg, "no local cluster") {
		t.Errorf("a second down: %d %s", code, msg)
	}
}

func errString(err error) string {
	if err == nil {
		return "alive"
	}
	return err.Error()
}
