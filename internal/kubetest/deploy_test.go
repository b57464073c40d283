package kubetest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/clustertls"
)

// deployDir is the repo's deploy/ directory.
const deployDir = "../../deploy"

// deployCopy copies deploy/ into a directory of the test's, with the
// files of its Secrets that an operator makes (docs/kubernetes.md), and
// returns the directory.
func deployCopy(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	yamls, _ := filepath.Glob(deployDir + "/*.yaml")
	for _, f := range yamls {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := clustertls.Generate(filepath.Join(dir, "tls"), time.Hour); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{
		"postgres.env":  "url=postgres://airlock:pw@db.example:5432/airlock\n",
		"cluster.env":   "token=" + strings.Repeat("t", 40) + "\n",
		"secrets.key":   strings.Repeat("s", 32),
		"e2b-token.key": strings.Repeat("e", 32),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// The manifests under deploy/ pass the apiserver's own validation (a
// server-side dry run, which stores nothing), with the Secrets the
// operator's files make and the servers and nodes pointed at them; applied,
// the RuntimeClass gives a sandbox Pod the placement of airlock nodes and
// the VMM's overhead. Without the operator's files, kubectl says which
// one is missing.
func TestDeployManifests(t *testing.T) {
	cp := Start(t)
	dir := deployCopy(t)
	// A dry run makes nothing, so the namespace the rest goes in must
	// exist first.
	cp.MustKubectl(t, "", "create", "namespace", "airlock")
	out := cp.MustKubectl(t, "", "apply", "--server-side", "--dry-run=server", "-k", dir)
	for _, want := range []string{"namespace/airlock", "runtimeclass.node.k8s.io/airlock", "serviceaccount/airlock-server",
		"role.rbac.authorization.k8s.io/airlock-controller", "rolebinding.rbac.authorization.k8s.io/airlock-controller",
		"clusterrole.rbac.authorization.k8s.io/airlock-server", "clusterrolebinding.rbac.authorization.k8s.io/airlock-server",
		"role.rbac.authorization.k8s.io/airlock-server", "rolebinding.rbac.authorization.k8s.io/airlock-server",
		"serviceaccount/airlock-node", "clusterrole.rbac.authorization.k8s.io/airlock-node",
		"clusterrolebinding.rbac.authorization.k8s.io/airlock-node", "role.rbac.authorization.k8s.io/airlock-node",
		"rolebinding.rbac.authorization.k8s.io/airlock-node",
		"deployment.apps/airlock-server", "service/airlock", "service/airlock-internal", "daemonset.apps/airlock-node",
		"secret/airlock-postgres-", "secret/airlock-cluster-", "secret/airlock-keys-",
		"secret/airlock-node-tls-", "secret/airlock-server-tls-"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run lacks %s: %s", want, out)
		}
	}
	if n := strings.Count(out, "serverside-applied (server dry run)"); n != 25 {
		t.Errorf("%d objects passed the dry run, want 25: %s", n, out)
	}
	if out, err := cp.Kubectl("", "get", "runtimeclass", "airlock"); err == nil {
		t.Fatalf("the dry run stored the RuntimeClass: %s", out)
	}
	if err := os.Remove(filepath.Join(dir, "postgres.env")); err != nil {
		t.Fatal(err)
	}
	if out, err := cp.Kubectl("", "apply", "--server-side", "--dry-run=server", "-k", dir); err == nil ||
		!strings.Contains(out, "postgres.env") {
		t.Errorf("no postgres.env: %v\n%s", err, out)
	}

	// The dry run refuses what the API refuses.
	rc, err := os.ReadFile(deployDir + "/runtimeclass.yaml")
	if err != nil {
		t.Fatal(err)
	}
	broken := strings.Replace(string(rc), "handler: airlock", "handler: Air Lock!", 1)
	if out, err := cp.Kubectl(broken, "apply", "--server-side", "--dry-run=server", "-f", "-"); err == nil ||
		!strings.Contains(out, "handler") {
		t.Errorf("a RuntimeClass with an invalid handler passed the dry run: %v\n%s", err, out)
	}

	// Applied, the servers and the nodes read the Secrets kustomize made
	// (their names carry a hash of their content, so a change rolls them).
	dir = deployCopy(t)
	cp.MustKubectl(t, "", "apply", "--server-side", "-k", dir)
	secrets := cp.MustKubectl(t, "", "-n", "airlock", "get", "secrets", "-o", "name")
	for _, workload := range []string{"deployment/airlock-server", "daemonset/airlock-node"} {
		var w struct {
			Spec struct {
				Template struct {
					Spec struct {
						ServiceAccountName string `json:"serviceAccountName"`
						Containers         []struct {
							Image string `json:"image"`
							Env   []struct {
								Name      string `json:"name"`
								ValueFrom *struct {
									SecretKeyRef *struct{ Name, Key string } `json:"secretKeyRef"`
								} `json:"valueFrom"`
							} `json:"env"`
						} `json:"containers"`
						Volumes []struct {
							Secret *struct {
								SecretName string `json:"secretName"`
							} `json:"secret"`
						} `json:"volumes"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		}
		if err := json.Unmarshal([]byte(cp.MustKubectl(t, "", "-n", "airlock", "get", workload, "-o", "json")), &w); err != nil {
			t.Fatal(err)
		}
		pod := w.Spec.Template.Spec
		refs := []string{}
		for _, c := range pod.Containers {
			if c.Image != "airlock:dev" {
				t.Errorf("%s: image %s, want airlock:dev", workload, c.Image)
			}
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					refs = append(refs, e.ValueFrom.SecretKeyRef.Name)
				}
			}
		}
		for _, v := range pod.Volumes {
			if v.Secret != nil {
				refs = append(refs, v.Secret.SecretName)
			}
		}
		if len(refs) != 4 {
			t.Errorf("%s refers to secrets %v, want the store's, the token's, the keys' and its role's TLS", workload, refs)
		}
		if tls := "airlock-" + map[string]string{"deployment/airlock-server": "server", "daemonset/airlock-node": "node"}[workload] + "-tls-"; !slices.ContainsFunc(refs, func(r string) bool { return strings.HasPrefix(r, tls) }) {
			t.Errorf("%s refers to secrets %v, none of them %s…", workload, refs, tls)
		}
		for _, ref := range refs {
			if !strings.Contains(secrets, "secret/"+ref+"\n") {
				t.Errorf("%s refers to secret %s, which is not among %s", workload, ref, secrets)
			}
		}
		if want := "airlock-" + strings.TrimPrefix(strings.Split(workload, "/")[1], "airlock-"); pod.ServiceAccountName != want {
			t.Errorf("%s runs as %s, want %s", workload, pod.ServiceAccountName, want)
		}
	}
	// No kube-controller-manager here to make the namespace's default
	// service account.
	cp.MustKubectl(t, "", "create", "serviceaccount", "default")
	pod := `{"apiVersion": "v1", "kind": "Pod",
  "metadata": {"name": "sbx-test", "labels": {"airlock.dev/sandbox-id": "sbxtest"}},
  "spec": {"runtimeClassName": "airlock", "terminationGracePeriodSeconds": 1,
    "containers": [{"name": "sandbox", "image": "airlock.dev/sandbox",
      "resources": {"requests": {"cpu": "1", "memory": "512Mi"}}}]}}`
	cp.MustKubectl(t, pod, "apply", "-f", "-")
	var got struct {
		Spec struct {
			Overhead     map[string]string `json:"overhead"`
			NodeSelector map[string]string `json:"nodeSelector"`
			Tolerations  []struct {
				Key, Operator, Value, Effect string
			} `json:"tolerations"`
		} `json:"spec"`
	}
	if err := json.Unmarshal([]byte(cp.MustKubectl(t, "", "get", "pod", "sbx-test", "-o", "json")), &got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.Overhead["cpu"] != "100m" || got.Spec.Overhead["memory"] != "128Mi" {
		t.Errorf("overhead %v, want cpu 100m and memory 128Mi", got.Spec.Overhead)
	}
	if got.Spec.NodeSelector["airlock.dev/node"] != "true" {
		t.Errorf("node selector %v, want airlock.dev/node=true", got.Spec.NodeSelector)
	}
	tolerated := false
	for _, tl := range got.Spec.Tolerations {
		if tl.Key == "virtual-kubelet.io/provider" && tl.Value == "airlock" && tl.Effect == "NoSchedule" {
			tolerated = true
		}
	}
	if !tolerated {
		t.Errorf("tolerations %+v lack the airlock nodes' taint", got.Spec.Tolerations)
	}
}
