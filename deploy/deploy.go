// Package deploy holds airlock's Kubernetes manifests (see
// docs/kubernetes.md), embedded so that the binary can apply the
// cluster-wide ones itself (`airlock localcluster`).
package deploy

import "embed"

// Manifests are the YAML files of this directory.
//
//go:embed *.yaml
var Manifests embed.FS

// Base are the manifests every airlock cluster needs before its servers
// and nodes run, in the order to apply them: the namespace, the
// RuntimeClass and the RBAC of the servers and the nodes.
var Base = []string{"namespace.yaml", "runtimeclass.yaml", "controller-rbac.yaml", "node-rbac.yaml"}

// ApplyBase applies Base with kubectl, a function that runs kubectl with
// stdin and args against a cluster.
func ApplyBase(kubectl func(stdin string, args ...string) (string, error)) error {
	for _, name := range Base {
		b, err := Manifests.ReadFile(name)
		if err != nil {
			return err
		}
		if _, err := kubectl(string(b), "apply", "--server-side", "-f", "-"); err != nil {
			return err
		}
	}
	return nil
}
