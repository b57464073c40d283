package cli

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/airlockhq/airlock/internal/clustertls"
	"github.com/airlockhq/airlock/internal/errdefs"
)

const clusterCertsAbout = `Makes the TLS of an airlock cluster in DIR: a new cluster CA (ca.crt,
ca.key) and a certificate for each role, DIR/node for the node agents
and DIR/server for the API replicas, each directory holding ca.crt,
tls.crt and tls.key. Every replica and node calls the others over TLS
with its role's certificate and takes only peers with one from this CA
(docs/kubernetes.md, "Cluster TLS"):

  airlock serve --cluster kubernetes --cluster-tls DIR/server ...
  airlock node --cluster-tls DIR/node ...

On Kubernetes, give them as the Secrets deploy/ mounts; the command
prints the kubectl lines. Keep ca.key off the cluster: it signs new
certificates. Any certificate the CA signs for the DNS name airlock-node
or airlock-server (cert-manager's, say) serves as well.`

func runClusterCerts(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("cluster-certs", "airlock cluster-certs [FLAGS] DIR", clusterCertsAbout, env)
	validity := fs.Duration("validity", 5*365*24*time.Hour, "how long the CA and the certificates are valid")
	namespace := fs.String("namespace", "airlock", "`namespace` of the Secrets in the kubectl lines printed")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("cluster-certs: give one DIR to write the cluster's CA and certificates to: %w", errdefs.ErrInvalid)
	}
	if *validity < time.Hour {
		return fmt.Errorf("cluster-certs: --validity %s is shorter than an hour: %w", *validity, errdefs.ErrInvalid)
	}
	dir := fs.Arg(0)
	if err := clustertls.Generate(dir, *validity); err != nil {
		return fmt.Errorf("cluster-certs: %w", err)
	}
	fmt.Fprintf(env.Stdout, "cluster CA and certificates in %s (valid until %s); on Kubernetes:\n", dir,
		time.Now().Add(*validity).UTC().Format(time.DateOnly))
	for _, s := range []struct{ name, sub string }{{"airlock-node-tls", "node"}, {"airlock-server-tls", "server"}} {
		d := filepath.Join(dir, s.sub)
		fmt.Fprintf(env.Stdout, "  kubectl -n %s create secret generic %s --from-file=%s --from-file=%s --from-file=%s\n",
			*namespace, s.name, filepath.Join(d, clustertls.CAFile), filepath.Join(d, clustertls.CertFile), filepath.Join(d, clustertls.KeyFile))
	}
	return nil
}
