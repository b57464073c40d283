package kubetest

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// deployDir is the repo's deploy/ directory.
const deployDir = "../../deploy"

// The manifests under deploy/ pass the apiserver's own validation (a
// server-side dry run, which stores nothing), and applied, the RuntimeClass
// gives a sandbox Pod the placement of airlock nodes and the VMM's
// overhead.
func TestDeployManifests(t *testing.T) {
	cp := Start(t)
	// A dry run makes nothing, so the namespace the rest goes in must
	// exist first.
	cp.MustKubectl(t, "", "create", "namespace", "airlock")
	out := cp.MustKubectl(t, "", "apply", "--server-side", "--dry-run=server", "-k", deployDir)
	for _, want := range []string{"namespace/airlock", "runtimeclass.node.k8s.io/airlock", "serviceaccount/airlock-server",
		"role.rbac.authorization.k8s.io/airlock-controller", "rolebinding.rbac.authorization.k8s.io/airlock-controller",
		"clusterrole.rbac.authorization.k8s.io/airlock-server", "clusterrolebinding.rbac.authorization.k8s.io/airlock-server",
		"role.rbac.authorization.k8s.io/airlock-server", "rolebinding.rbac.authorization.k8s.io/airlock-server",
		"serviceaccount/airlock-node", "clusterrole.rbac.authorization.k8s.io/airlock-node",
		"clusterrolebinding.rbac.authorization.k8s.io/airlock-node", "role.rbac.authorization.k8s.io/airlock-node",
		"rolebinding.rbac.authorization.k8s.io/airlock-node"} {
		if !strings.Contains(out, want+" serverside-applied (server dry run)") {
			t.Errorf("dry run lacks %s: %s", want, out)
		}
	}
	if out, err := cp.Kubectl("", "get", "runtimeclass", "airlock"); err == nil {
		t.Fatalf("the dry run stored the RuntimeClass: %s", out)
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

	cp.MustKubectl(t, "", "apply", "--server-side", "-k", deployDir)
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
