// Package kubetest runs a Kubernetes control plane for tests
// (internal/localkube) from the binaries in $AIRLOCK_KUBE_BIN, with its
// files in the test's temporary directory, stopped when the test ends.
package kubetest

import (
	"os"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/airlockhq/airlock/deploy"
	"github.com/airlockhq/airlock/internal/localkube"
	"github.com/airlockhq/airlock/internal/testenv"
)

// ControlPlane is a running etcd and kube-apiserver.
type ControlPlane struct {
	*localkube.ControlPlane
}

// Start starts a control plane that is stopped when the test ends. Each
// of users ("system:serviceaccount:NS:NAME" for a service account) gets a
// bearer token of its own, for ConfigAs. A host without the binaries
// (AIRLOCK_KUBE_BIN unset or wrong) or kubectl is Lacking.
func Start(t *testing.T, users ...string) *ControlPlane {
	t.Helper()
	bin := os.Getenv("AIRLOCK_KUBE_BIN")
	if err := localkube.Check(bin, "etcd", "kube-apiserver"); err != nil {
		testenv.Lacking(t, "%v (make unit builds them)", err)
	}
	cp, err := localkube.Start(t.TempDir(), bin, users...)
	t.Cleanup(cp.Stop)
	if err != nil {
		t.Fatal(err)
	}
	return &ControlPlane{cp}
}

// ConfigAs is RestConfig for one of the users given to Start.
func (cp *ControlPlane) ConfigAs(t *testing.T, user string) *rest.Config {
	t.Helper()
	cfg, err := cp.ControlPlane.ConfigAs(user)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// KubeconfigAs writes a kubeconfig for one of the users given to Start,
// for a process the test runs as that user, and returns its path.
func (cp *ControlPlane) KubeconfigAs(t *testing.T, user string) string {
	t.Helper()
	path, err := cp.ControlPlane.KubeconfigAs(user)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// StartScheduler runs kube-scheduler against the control plane until the
// test ends.
func (cp *ControlPlane) StartScheduler(t *testing.T) {
	t.Helper()
	if err := localkube.Check(os.Getenv("AIRLOCK_KUBE_BIN"), "kube-scheduler"); err != nil {
		testenv.Lacking(t, "%v (make unit builds it)", err)
	}
	if err := cp.ControlPlane.StartScheduler(); err != nil {
		t.Fatal(err)
	}
}

// ApplyBase applies deploy.Base, the manifests that come before the
// servers and nodes: the namespace, the RuntimeClass and the RBAC.
func (cp *ControlPlane) ApplyBase(t *testing.T) {
	t.Helper()
	if err := deploy.ApplyBase(cp.Kubectl); err != nil {
		t.Fatal(err)
	}
}

// MustKubectl is Kubectl that fails the test on an error.
func (cp *ControlPlane) MustKubectl(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	out, err := cp.Kubectl(stdin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
